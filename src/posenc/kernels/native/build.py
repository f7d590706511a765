"""Build posenc's compiled CPU op against the installed torch: ``python -m posenc.kernels.native.build``.

``make install`` runs this once after installing posenc (and again when the source or torch changes); a
user's process never compiles anything. It calls the C++ compiler directly with torch's own headers and
libraries (no build isolation, so no second torch is fetched) and writes, beside the source:

* ``_posenc_cpu.so``: the library, loaded by :func:`posenc.kernels.native.load` with
  ``torch.ops.load_library``; it registers ``torch.ops.posenc.rotary``.
* ``_posenc_cpu.json``: what it was built from (torch version, C++ ABI flag, the sha256 of the source and
  of this builder, the compiler command). The loader refuses a library whose record does not match the
  running torch or source: the op is bound to torch's C++ ABI, so a torch upgrade needs a rebuild
  (``make install`` does it).

Without a compiler it says so and exits 0: posenc then runs its torch kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "rotary_cpu.cpp"
LIBRARY = HERE / "_posenc_cpu.so"
RECORD = HERE / "_posenc_cpu.json"

__all__ = ["LIBRARY", "RECORD", "SOURCE", "build", "expected_record", "main", "stale"]


def source_digest() -> str:
    """sha256 of the C++ source and of this file (its compiler flags): a change to either needs a rebuild."""
    return hashlib.sha256(SOURCE.read_bytes() + Path(__file__).read_bytes()).hexdigest()


def expected_record() -> dict:
    """What a library usable in this process was built from."""
    import torch

    return {
        "torch": torch.__version__,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "source_sha256": source_digest(),
    }


def stale(record: Path = RECORD) -> list[str]:
    """The keys of :func:`expected_record` on which the build recorded at ``record`` differs from this process
    (all of them when there is no readable record): empty when the library there is usable."""
    try:
        found = json.loads(Path(record).read_text())
    except (OSError, ValueError):
        found = {}
    return [key for key, value in expected_record().items() if found.get(key) != value]


def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else c++ / g++ / clang++ on PATH; None when there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def command(cxx: str, output: Path) -> list[str]:
    """The one compiler call: torch's headers and libraries, float32 loops vectorised for this CPU."""
    import torch
    from torch.utils import cpp_extension

    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        cxx,
        str(SOURCE),
        "-o",
        str(output),
        "-shared",
        "-fPIC",
        "-std=c++20",
        "-O3",
        "-march=native",  # built on the machine that runs it, by make install
        "-ffp-contract=off",  # a * cos - b * sin rounded as torch rounds it: equal to the eager formula
        "-fopenmp",  # at::parallel_for's OpenMP region lives in the header: it needs the flag here
        "-DNDEBUG",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *includes,
        *(f"-L{path}" for path in libs),
        *(f"-Wl,-rpath,{path}" for path in libs),
        "-lc10",
        "-ltorch_cpu",
        "-ltorch",
    ]


def build(*, quiet: bool = False, directory: Path = HERE) -> bool:
    """Compile the op into ``directory`` (beside the source; ``pip install`` passes its build folder) unless
    an up-to-date build is there; True when a usable library exists afterwards."""
    library, record = Path(directory) / LIBRARY.name, Path(directory) / RECORD.name
    if library.exists() and not stale(record):
        _say(quiet, f"posenc: the compiled CPU op is up to date ({library})")
        os.utime(library)  # newer than what make compares it with
        return True
    if sysconfig.get_platform().startswith(("win", "macosx")):
        _say(quiet, "posenc: the compiled CPU op is built on Linux only; the torch kernels run instead")
        return False
    cxx = compiler()
    if cxx is None:
        _say(quiet, "posenc: no C++ compiler found ($CXX, c++, g++, clang++); the torch kernels run instead")
        return False
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        partial = Path(scratch) / LIBRARY.name
        cmd = command(cxx, partial)
        _say(quiet, f"posenc: building the compiled CPU op with {cxx} (seconds)")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            _say(quiet, "posenc: the build failed (above); the torch kernels run instead")
            return False
        os.replace(partial, library)  # atomic: a process loading the op never sees half a file
    record.write_text(json.dumps({**expected_record(), "command": cmd}, indent=1) + "\n")
    _say(quiet, f"posenc: built {library}")
    return True


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.kernels.native.build", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if an up-to-date build exists")
    parser.add_argument("--require", action="store_true", help="exit 1 when the op could not be built")
    args = parser.parse_args(argv)
    if args.force:
        LIBRARY.unlink(missing_ok=True)
    ok = build()
    return 1 if args.require and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
