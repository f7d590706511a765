"""What ``import posenc`` costs on top of ``import torch``: no compiler stack, no optional dependency."""

import subprocess
import sys


def _modules_after(statement: str, names: tuple[str, ...]) -> dict[str, bool]:
    code = f"import sys; {statement}; print([n in sys.modules for n in {list(names)!r}])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(zip(names, eval(out.strip().splitlines()[-1]), strict=True))


def test_importing_posenc_loads_no_compiler_and_no_optional_dependency():
    """torch.compiler.disable at import pulled in dynamo: ~2.5 s on every CLI call and compare worker."""
    heavy = ("torch._dynamo", "torch._inductor", "transformers", "matplotlib", "triton")
    loaded = _modules_after("import posenc", heavy)
    assert not any(loaded.values()), [n for n, v in loaded.items() if v]
