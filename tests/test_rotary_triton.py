"""The Triton RoPE kernel, run by Triton's interpreter on CPU tensors (CI has no GPU).

``TRITON_INTERPRET=1`` must be set before triton is imported, and it changes how posenc dispatches (the
interpreter counts as a Triton device), so the checks of :mod:`posenc.tools.benchmarks.triton_checks` run in a
child process. Each compares with posenc.reference or the eager module; the same checks run on a GPU from
``benchmarks/gpu_check.sh``.
"""

import os
import subprocess
import sys


def test_triton_kernel_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "posenc.tools.benchmarks.triton_checks", "cpu"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("ALL OK")


def test_triton_not_used_for_cpu_tensors_without_interpreter(monkeypatch):
    """Outside the interpreter, CPU tensors take the torch path even with triton installed."""
    import torch

    from posenc.kernels import _use_triton

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not _use_triton([torch.randn(1, 2, 3, 4)], None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _use_triton([torch.randn(1, 2, 3, 4)], None)
