"""pip's hook into posenc's build: installing from the checkout also compiles the C++ CPU op, when it can.

The op is bound to the C++ ABI of the torch that loads it, so it is built only where that torch is importable
during the install: ``pip install --no-build-isolation .`` (or ``-e .``) after installing torch, as
``make install`` does. In pip's default isolated build there is no torch (fetching one there would pull a
second, by default the multi-GB CUDA build), so the op is skipped; posenc then runs its torch kernels and says
once how to build the op (``python -m posenc.kernels.native.build``). Everything else is in pyproject.toml.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUILDER = Path(__file__).resolve().parent / "src" / "posenc" / "kernels" / "native" / "build.py"


class BuildPyWithNativeOp(build_py):
    def run(self):
        super().run()
        if importlib.util.find_spec("torch") is None:
            print(
                "posenc: no torch in this build environment (pip's build isolation); the compiled CPU op is "
                "not built: run `python -m posenc.kernels.native.build` after installing",
                file=sys.stderr,
            )
            return
        spec = importlib.util.spec_from_file_location("posenc_native_build", BUILDER)
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        editable = getattr(self, "editable_mode", False)
        builder.build(directory=BUILDER.parent if editable else Path(self.build_lib, "posenc/kernels/native"))


setup(cmdclass={"build_py": BuildPyWithNativeOp})
