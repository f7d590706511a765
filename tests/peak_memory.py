"""Peak resident memory of one forward + backward, measured in a fresh process (the CPU allocator keeps no
per-call peak of its own, and a fresh process holds nothing from other tests)."""

import os
import subprocess
import sys


def peak_rise_mib(setup: str, call: str, seq: int) -> float:
    """MiB the peak RSS rose by while ``call`` ran forward and backward on q, k, v (1, 4, seq, 16).

    ``setup`` imports and builds what ``call`` needs (``posenc`` and ``torch`` are imported); ``call`` is an
    expression of ``q``, ``k``, ``v`` returning the attention output. A tiny call first warms up the code.
    """
    child = "\n".join(
        [
            "import resource, torch, posenc",
            "torch.set_num_threads(1)",
            setup,
            "q, k, v = (torch.randn(1, 4, 64, 16, requires_grad=True) for _ in range(3))",
            f"({call}).sum().backward()",
            f"q, k, v = (torch.randn(1, 4, {seq}, 16, requires_grad=True) for _ in range(3))",
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss",
            f"({call}).sum().backward()",
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(proc.stdout.strip().splitlines()[-1])
