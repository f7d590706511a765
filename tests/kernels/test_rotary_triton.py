"""The Triton RoPE kernel against posenc.reference and the eager rotation, on CUDA or under Triton's
interpreter.

The cases live in :mod:`.triton_cases`. On a machine with a GPU they are collected here and run on CUDA
tensors (``benchmarks/gpu_check.sh`` runs this file). Without one, ``TRITON_INTERPRET=1`` must be set before
triton is imported, and it changes how posenc dispatches (the interpreter counts as a Triton device), so
:func:`test_kernel_under_the_interpreter` runs the cases in a child process with it set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.kernels import triton_available

ON_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"

if ON_TRITON and triton_available():
    from .triton_cases import *  # noqa: F403  (collected here: this process can run the kernel)
else:

    def test_kernel_under_the_interpreter():
        pytest.importorskip("triton")
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
        cases = Path(__file__).with_name("triton_cases.py")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(cases)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        summary = proc.stdout.strip().splitlines()[-1]
        passed = re.search(r"(\d+) passed", summary)
        assert passed and int(passed.group(1)) >= 20 and "skipped" not in summary, summary


def test_triton_not_used_for_cpu_tensors_without_interpreter(monkeypatch):
    """Outside the interpreter, CPU tensors take the torch path even with triton installed."""
    from posenc.kernels import uses_triton

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not uses_triton([torch.randn(1, 2, 3, 4)])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert uses_triton([torch.randn(1, 2, 3, 4)]) == triton_available()
