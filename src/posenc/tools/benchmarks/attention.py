"""Long-context ALiBi attention: time and peak memory of three ways to attend.

Cases, at batch 1 and the preset's heads and head_dim, causal, forward (inference):

* ``posenc``: ``posenc.attention(q, k, v, bias=ALiBi(heads), causal=True)``, the path a user gets (the
  row's ``backend`` says which: FlexAttention on CUDA, the blocked kernel or the materialised bias on CPU);
* ``sdpa+bias``: ``F.scaled_dot_product_attention`` with the materialised (heads, L, L) ALiBi bias, skipped
  where its estimated footprint (the bias plus the score and weight matrices) exceeds half the memory
  available now;
* ``sdpa causal``: causal SDPA with no bias, the floor any bias must pay on top of.

Peak memory is what the calls added on top of q, k, v (:mod:`.memory`). On the CPU each case runs in a
fresh Python process, because the resident-set high-water mark is per process; on CUDA the peak
statistics count allocations exactly, so the cases run in this process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

import posenc
from posenc.attention import alibi_backend
from posenc.runs import memory

from .presets import Preset
from .report import Column, number, table
from .timing import interleaved_times

CASES = ("posenc", "sdpa+bias", "sdpa causal")
_CPU = torch.device("cpu")


def attend(case: str, bias: posenc.ALiBi | posenc.ScoreBias | None) -> Callable[..., torch.Tensor]:
    """The call one case makes: (q, k, v), each (batch, heads, seq, head_dim) -> the attention output.

    ``bias`` is any posenc score bias (ALiBi, T5Bias, ...): the ``bias`` benchmark reuses these calls.
    """
    if case == "posenc":
        return lambda q, k, v: posenc.attention(q, k, v, bias=bias, causal=True)
    if case == "sdpa+bias":
        return lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.bias(q.shape[2], k.shape[2], causal=True).to(q.dtype)
        )
    if case == "sdpa causal":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    raise ValueError(f"case must be one of {CASES}, got {case!r}")


def materialised_bytes(seq: int, heads: int, element_size: int = 4, matrices: int = 3) -> int:
    """Rough footprint of SDPA with a materialised bias: ``matrices`` (heads, seq, seq) tensors (forward:
    the bias, the scores and the weights; a backward adds their gradients)."""
    return matrices * heads * seq * seq * element_size


def materialised_fits(need: int, device: torch.device) -> str | None:
    """None where ``need`` bytes fit in half the memory available now, else why the case is skipped."""
    avail = memory.available_bytes(device)
    if need <= avail // 2:
        return None
    return f"needs ~{need / 2**30:.0f} GiB for the bias and scores, {avail / 2**30:.0f} GiB available"


def random_qkv(
    seq: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, seq, dim, generator=gen).to(device, dtype) for _ in range(3)]


def measure(case: str, seq: int, heads: int, dim: int, repeat: int, device=_CPU, dtype=torch.float32) -> dict:
    """Time ``repeat`` calls of one case at length ``seq`` in this process.

    Returns seconds (the median), peak_bytes (added on top of q, k, v) and backend (posenc's ALiBi path).
    """
    fn = attend(case, posenc.ALiBi(heads).to(device))
    with torch.no_grad():
        fn(*random_qkv(128, heads, dim, dtype, device))  # load kernels and thread pools before the baseline
        q, k, v = random_qkv(seq, heads, dim, dtype, device)
        if device.type == "cuda":
            fn(q, k, v)  # compile for this shape; CUDA's peak counts live allocations, not cached ones
        peak = memory.peak_meter(device)
        times = interleaved_times({case: lambda: fn(q, k, v)}, repeat, warmup=0, device=device)[case]
        added = peak()
    backend = alibi_backend(q, k) if case == "posenc" else None
    return {"seconds": statistics.median(times), "peak_bytes": added, "backend": backend}


def in_child(module: str, *args) -> dict:
    """Run ``python -m module args...`` in a fresh process and parse the JSON object on its last line of
    output; {"skipped": why} where it failed. A fresh process per case keeps each peak its own."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        err = proc.stderr.strip()
        return {"skipped": f"failed: {err.splitlines()[-1] if err else proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def answer_parent(result: dict) -> None:
    """The child's side of :func:`in_child`: the result as the last line of output, then exit at once (the
    parent needs nothing else, and interpreter teardown only costs time)."""
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def _in_child(case: str, seq: int, heads: int, dim: int, repeat: int) -> dict:
    """:func:`measure` on the CPU in a fresh Python process; {"skipped": why} where it failed."""
    return in_child(__name__, case, seq, heads, dim, repeat)


def run_case(
    case: str, seq: int, heads: int, dim: int, repeat: int, device=_CPU, dtype=torch.float32
) -> dict:
    """One case's result row; a fresh process on the CPU, this one on CUDA."""
    row = {"case": case, "seq": seq, "heads": heads, "head_dim": dim}
    if case == "sdpa+bias":
        why = materialised_fits(materialised_bytes(seq, heads, dtype.itemsize), device)
        if why is not None:
            return {**row, "skipped": why}
    if device.type == "cpu":
        return {**row, **_in_child(case, seq, heads, dim, repeat)}
    try:
        return {**row, **measure(case, seq, heads, dim, repeat, device, dtype)}
    except torch.cuda.OutOfMemoryError as err:
        return {**row, "skipped": f"failed: {str(err).splitlines()[0]}"}


def run(preset: Preset, device: torch.device, repeat: int | None = None) -> list[dict]:
    """Every length and case of ``preset``; ``repeat`` overrides the preset's count."""
    rows = []
    for seq in preset.lengths:
        reps = repeat or preset.attention_repeat
        # Fewer repeats where one call takes seconds; the median of 3 still shrugs off one noisy run.
        reps = reps if seq < 16384 else max(1, min(reps, 3))
        for case in CASES:
            rows.append(
                run_case(case, seq, preset.heads, preset.head_dim, reps, device, preset.attention_dtype)
            )
    floor = {r["seq"]: r["seconds"] for r in rows if r["case"] == "sdpa causal" and "seconds" in r}
    for r in rows:
        if "seconds" in r and r["seq"] in floor:
            r["x_causal_sdpa"] = r["seconds"] / floor[r["seq"]]
    return rows


COLUMNS = (
    Column("L", 6, lambda r: str(r["seq"])),
    Column("case", -12, lambda r: r["case"]),
    Column("seconds", 9, lambda r: f"{r['seconds']:.3f}"),
    Column("peak MiB", 9, lambda r: f"{r['peak_bytes'] / 2**20:.0f}"),
    Column("x causal SDPA", 14, lambda r: number(r.get("x_causal_sdpa"), ".2f", missing="")),
    Column("backend", -11, lambda r: r["backend"] or ""),
)


def attention_table(rows: list[dict]) -> str:
    """The rows as a table (a skipped case shows why)."""
    title = "ALiBi attention, batch 1, causal, forward (peak = memory added on top of q, k, v)"
    return table(title, COLUMNS, rows)


if __name__ == "__main__":
    case, seq, heads, dim, repeat = sys.argv[1], *map(int, sys.argv[2:6])
    answer_parent(measure(case, seq, heads, dim, repeat))
