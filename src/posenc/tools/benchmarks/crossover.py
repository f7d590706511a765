"""Where a score bias should be materialised on the CPU: ``posenc bench --only crossover``.

For every table and tile bias, at short and middle lengths, the two CPU paths of
``posenc.attention(q, k, v, bias=obj)`` side by side in one process (round-robin, medians):

* ``materialised``: the bias's (heads, L, L) ``.bias()`` with the causal -inf, added by SDPA (the whole
  batch shares it); forward + backward takes the bias's parameter gradients through it;
* ``blocked``: the bias's own ``blocked_attention`` (O(L) memory per head).

Two shape families: the laboratory's training shape (batch 16, 8 heads of 16) and a model's (batch 1, 8
heads of 64). The ratio blocked / materialised per row, and per bias the largest heads x L^2 at which
materialising was faster, are what ``posenc.attention`` reads its per-bias thresholds from
(``ScoreBias.materialise_max``; docs/fast-paths.md has the table).
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from .biases import BIASES, _call
from .report import Column, number, table
from .timing import interleaved_times

# (family, batch, heads, head_dim, lengths); quick: one short length each
SHAPES = (
    ("lab", 16, 8, 16, (64, 128, 256, 512)),
    ("model", 1, 8, 64, (256, 512, 1024, 2048)),
)
MODES = ("forward", "forward+backward")


def _paths(bias) -> dict:
    """The two CPU paths of posenc.attention for ``bias``, as functions of (q, k, v)."""

    def materialised(q, k, v):
        mask = bias.bias(q.shape[2], k.shape[2], causal=True).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def blocked(q, k, v):
        return bias.blocked_attention(q, k, v, True, q.shape[-1] ** -0.5)

    return {"materialised": materialised, "blocked": blocked}


def measure(name: str, family: str, batch: int, heads: int, dim: int, seq: int, mode: str, repeat: int):
    """One row: seconds of each path (medians of ``repeat`` round-robin calls) and their ratio."""
    bias = BIASES[name][1](heads, dim)
    params = tuple(p for p in bias.parameters() if p.requires_grad)
    gen = torch.Generator().manual_seed(seq)
    qkv = tuple(
        torch.randn(batch, heads, seq, dim, generator=gen).requires_grad_(mode != "forward") for _ in range(3)
    )
    calls = {path: _call(fn, qkv, params, mode) for path, fn in _paths(bias).items()}
    times = {p: statistics.median(ts) for p, ts in interleaved_times(calls, repeat, warmup=1).items()}
    return {
        "bias": name,
        "family": family,
        "batch": batch,
        "heads": heads,
        "seq": seq,
        "mode": mode,
        "entries": heads * seq * seq,
        "materialised_seconds": times["materialised"],
        "blocked_seconds": times["blocked"],
        "blocked_over_materialised": times["blocked"] / times["materialised"],
    }


def run(quick: bool = False, repeat: int | None = None) -> list[dict]:
    """Every (bias, shape, length, mode) row; ``quick``: the shortest length of each family only."""
    repeat = repeat or (1 if quick else 5)
    rows = []
    for name, (kind, _, _) in BIASES.items():
        if kind == "content":  # no bias to materialise
            continue
        for family, batch, heads, dim, lengths in SHAPES:
            for seq in lengths[:1] if quick else lengths:
                for mode in MODES:
                    rows.append(measure(name, family, batch, heads, dim, seq, mode, repeat))
    return rows


def crossover_table(rows: list[dict]) -> str:
    columns = [
        Column("bias", -16, lambda r: r["bias"]),
        Column("shape", -6, lambda r: r["family"]),
        Column("B", 3, lambda r: str(r["batch"])),
        Column("L", 5, lambda r: str(r["seq"])),
        Column("mode", -17, lambda r: r["mode"]),
        Column("heads*L^2", 10, lambda r: str(r["entries"])),
        Column("materialised s", 15, lambda r: number(r["materialised_seconds"], ".4g")),
        Column("blocked s", 10, lambda r: number(r["blocked_seconds"], ".4g")),
        Column("blocked/mat", 12, lambda r: number(r["blocked_over_materialised"], ".2f")),
    ]
    return table("Score biases on the CPU: materialised SDPA against the blocked kernel", columns, rows)
