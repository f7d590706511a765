"""Long-context ALiBi attention: time and peak memory of three ways to attend, each in a fresh subprocess.

Cases, at batch 1 and the given heads and head_dim, causal, forward (inference):

* ``posenc``: ``posenc.attention(q, k, v, bias=ALiBi(heads), causal=True)``, the path a user gets;
* ``sdpa+bias``: ``F.scaled_dot_product_attention`` with the materialised (heads, L, L) ALiBi bias, skipped
  where its estimated footprint (the bias plus the score and weight matrices) exceeds half the memory
  available now;
* ``sdpa causal``: causal SDPA with no bias, the floor any bias must pay on top of.

Peak memory is what the calls added on top of q, k, v, measured by the kernel, not estimated: the child
builds q, k, v and warms up on a small input, resets its resident-set high-water mark (``VmHWM``, by
writing 5 to ``/proc/self/clear_refs``), runs the timed calls, and reports ``VmHWM`` minus the resident
set before them. Where the reset is not allowed it falls back to the rise of ``ru_maxrss``, which cannot
see below the import-time high-water mark.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

FULL_LENGTHS = [2048, 8192, 16384]
QUICK_LENGTHS = [256, 1024]
CASES = ("posenc", "sdpa+bias", "sdpa causal")


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def materialised_bytes(seq: int, heads: int) -> int:
    """Rough footprint of SDPA with a materialised float32 bias: the bias, the scores and the weights."""
    return 3 * heads * seq * seq * 4


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset this process's peak resident set to the current one (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_bytes("VmHWM")
        return True
    except (OSError, KeyError):
        return False


def _case(case: str, seq: int, heads: int, dim: int, repeat: int) -> dict:
    """Run in the child: build inputs, warm up, time ``repeat`` calls, report time and memory rise."""
    import time

    import torch
    import torch.nn.functional as F

    import posenc

    alibi = posenc.ALiBi(heads)

    def call(q, k, v):
        if case == "posenc":
            return posenc.attention(q, k, v, bias=alibi, causal=True)
        if case == "sdpa+bias":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=alibi.bias(q.shape[2], k.shape[2], causal=True))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        small = [torch.randn(1, heads, 128, dim) for _ in range(3)]
        call(*small)  # load kernels and thread pools before the baseline
        del small
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, seq, dim, generator=gen) for _ in range(3))
        reset = _reset_peak()
        before = _status_bytes("VmRSS") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = call(q, k, v)
            times.append(time.perf_counter() - t0)
            del out
        after = _status_bytes("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times.sort()
    return {"seconds": times[len(times) // 2], "peak_bytes": max(0, after - before)}


def run_case(case: str, seq: int, heads: int, dim: int, repeat: int) -> dict:
    """Run one case in a fresh Python process and return its result row."""
    row = {"case": case, "seq": seq, "heads": heads, "head_dim": dim}
    if case == "sdpa+bias":
        need, avail = materialised_bytes(seq, heads), _available_bytes()
        if need > avail // 2:
            row.update(skipped=f"needs ~{need / 2**30:.0f} GiB for the bias and scores, {avail / 2**30:.0f} GiB available")
            return row
    cmd = [sys.executable, "-m", "posenc.tools.benchmarks.attention", case, str(seq), str(heads), str(dim), str(repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        row.update(skipped=f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
        return row
    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return row


def run(quick: bool = False, repeat: int | None = None, heads: int = 8, dim: int = 64) -> list[dict]:
    lengths = QUICK_LENGTHS if quick else FULL_LENGTHS
    repeat = repeat or (2 if quick else 3)
    rows = []
    for seq in lengths:
        # Fewer repeats where one call takes seconds; the median of 3 still shrugs off one noisy run.
        reps = repeat if seq < 16384 else max(1, min(repeat, 3))
        for case in CASES:
            rows.append(run_case(case, seq, heads, dim, reps))
    floor = {r["seq"]: r["seconds"] for r in rows if r["case"] == "sdpa causal" and "seconds" in r}
    for r in rows:
        if "seconds" in r and r["seq"] in floor:
            r["x_causal_sdpa"] = r["seconds"] / floor[r["seq"]]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["ALiBi attention, batch 1, causal, forward (peak = resident memory added on top of q, k, v)",
             f"{'L':>6} {'case':<12} {'seconds':>9} {'peak MiB':>9} {'x causal SDPA':>14}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['seq']:>6} {r['case']:<12} skipped: {r['skipped']}")
            continue
        ratio = f"{r['x_causal_sdpa']:.2f}" if "x_causal_sdpa" in r else ""
        lines.append(f"{r['seq']:>6} {r['case']:<12} {r['seconds']:>9.3f} {r['peak_bytes'] / 2**20:>9.0f} {ratio:>14}")
    return "\n".join(lines)


if __name__ == "__main__":
    case, seq, heads, dim, repeat = sys.argv[1], *map(int, sys.argv[2:6])
    if case not in CASES:
        raise SystemExit(f"case must be one of {CASES}, got {case!r}")
    print(json.dumps(_case(case, seq, heads, dim, repeat)))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: the parent only needs the line above
