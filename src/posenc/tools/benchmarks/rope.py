"""RoPE throughput: posenc's fused rotation of q and k against the copy floor and transformers' eager code.

For each shape and dtype, in one process and round-robin (see :func:`.timing.interleaved_medians`):

* ``copy``: ``dst.copy_(src)`` for q and for k, the same bytes a rotation reads and writes (the floor);
* ``hf``: transformers' ``apply_rotary_pos_emb`` (Llama, "half" layout) with its (1, seq, head_dim) cos/sin;
* posenc's :class:`~posenc.RotaryEmbedding` ``forward(q, k)`` in both layouts, out of place (new outputs,
  autograd-capable) and ``inplace=True``.

GB/s counts the bytes read and written: 2 x (q.nbytes + k.nbytes).
"""

from __future__ import annotations

import statistics

import torch

from ...rope import RotaryEmbedding
from .timing import interleaved_times

FULL_SHAPES = [(4, 16, 2048, 128), (1, 32, 8192, 128)]
QUICK_SHAPES = [(1, 2, 64, 32)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _hf_apply():
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except Exception:  # transformers is optional: the row then has no ratio
        return None
    return apply_rotary_pos_emb


def bench_shape(shape: tuple[int, int, int, int], dtype: torch.dtype, repeat: int) -> list[dict]:
    """One row per posenc variant for q and k of this shape and dtype."""
    b, h, seq, d = shape
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=gen).to(dtype)
    k = torch.randn(shape, generator=gen).to(dtype)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    ropes = {layout: RotaryEmbedding(d, layout=layout) for layout in ("half", "interleaved")}
    for rope in ropes.values():
        rope.cos_sin(seq)  # fill the angle cache outside the timed calls
    cases = {"copy": lambda: (dq.copy_(q), dk.copy_(k))}
    hf = _hf_apply()
    if hf is not None:
        cos, sin = ropes["half"].cos_sin(seq)
        cos_full = torch.cat((cos, cos), dim=-1).to(dtype)[None]  # (1, seq, d), as LlamaRotaryEmbedding returns
        sin_full = torch.cat((sin, sin), dim=-1).to(dtype)[None]
        cases["hf"] = lambda: hf(q, k, cos_full, sin_full)
    for layout, rope in ropes.items():
        cases[f"{layout}/out"] = lambda rope=rope: rope(q, k)
        # In place on q and k themselves: the values drift, the cost does not.
        cases[f"{layout}/inplace"] = lambda rope=rope: rope(q, k, inplace=True)
    with torch.no_grad():
        raw = interleaved_times(cases, repeat)
    t = {name: statistics.median(ts) for name, ts in raw.items()}
    nbytes = 2 * (q.nbytes + k.nbytes)
    rows = []
    for name, sec in t.items():
        if name in ("copy", "hf"):
            continue
        layout, mode = name.split("/")
        rows.append({
            "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "layout": layout, "mode": mode,
            "ms": sec * 1e3, "gb_per_s": nbytes / sec / 1e9, "copy_ms": t["copy"] * 1e3,
            "copy_gb_per_s": nbytes / t["copy"] / 1e9, "fraction_of_copy": t["copy"] / sec,
            "hf_ms": t["hf"] * 1e3 if "hf" in t else None, "speedup_vs_hf": t["hf"] / sec if "hf" in t else None,
            # The fastest call of each, for a reader judging how much of the median is other processes' load.
            "best_ms": min(raw[name]) * 1e3, "best_copy_ms": min(raw["copy"]) * 1e3,
            "best_hf_ms": min(raw["hf"]) * 1e3 if "hf" in raw else None,
        })
    return rows


def run(quick: bool = False, repeat: int | None = None) -> list[dict]:
    shapes = QUICK_SHAPES if quick else FULL_SHAPES
    repeat = repeat or (3 if quick else 11)
    rows = []
    for shape in shapes:
        for dtype in DTYPES.values():
            rows.extend(bench_shape(shape, dtype, repeat))
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'shape':<20} {'dtype':<9} {'layout':<12} {'mode':<8} {'ms':>8} {'GB/s':>7} {'copy%':>6} {'x HF':>6}"
            f" {'best: copy%':>11} {'x HF':>6}")
    lines = ["RoPE on q and k, medians (copy% = share of this process's dst.copy_(src) bandwidth; x HF = speed-up "
             "over transformers' apply_rotary_pos_emb; best: the same from each case's fastest call)", head]
    for r in rows:
        hf = f"{r['speedup_vs_hf']:.1f}" if r["speedup_vs_hf"] is not None else "n/a"
        best_hf = f"{r['best_hf_ms'] / r['best_ms']:.1f}" if r.get("best_hf_ms") else "n/a"
        lines.append(f"{str(tuple(r['shape'])):<20} {r['dtype']:<9} {r['layout']:<12} {r['mode']:<8} {r['ms']:>8.2f} "
                     f"{r['gb_per_s']:>7.1f} {100 * r['fraction_of_copy']:>5.0f}% {hf:>6} "
                     f"{100 * r['best_copy_ms'] / r['best_ms']:>10.0f}% {best_hf:>6}")
    return "\n".join(lines)
