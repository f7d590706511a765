"""Where a score bias should be materialised on the CPU: ``posenc bench --only crossover``.

For every table and tile bias, at short and middle lengths, the two CPU paths of
``posenc.attention(q, k, v, bias=obj)`` side by side in one process (round-robin, medians):

* ``materialised``: the bias's (heads, L, L) ``.bias()`` with the causal -inf, added by SDPA (the whole
  batch shares it); forward + backward takes the bias's parameter gradients through it;
* ``blocked``: the bias's own ``blocked_attention`` (O(L) memory per head).

Three shape families: the laboratory's training shape (batch 16, 8 heads of 16), a model's prefill (batch 1,
8 heads of 64), and decoding (a few queries against a cache of keys, batch 1 and 16, forward only). The
ratio blocked / materialised per row is what ``posenc.attention``'s choice (``attention.bias_backend``:
``DECODE_QUERIES``, ``ScoreBias.materialise_max``) was read from; docs/fast-paths.md has the table.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from .biases import BIASES, timed_call
from .report import Column, number, table
from .timing import interleaved_times

# (family, batch, heads, head_dim, (q_len, k_len) pairs, modes); quick: the first pair of each
SHAPES = (
    ("lab", 16, 8, 16, tuple((n, n) for n in (64, 128, 256, 512)), ("forward", "forward+backward")),
    ("model", 1, 8, 64, tuple((n, n) for n in (256, 512, 1024, 2048)), ("forward", "forward+backward")),
    ("decode", 1, 8, 64, ((1, 512), (16, 512), (64, 512), (1, 4096)), ("forward",)),
    ("decode", 16, 8, 64, ((1, 512), (16, 512), (64, 512)), ("forward",)),
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


def measure(name: str, family: str, batch: int, heads: int, dim: int, lengths, mode: str, repeat: int):
    """One row: seconds of each path (medians of ``repeat`` round-robin calls) and their ratio.
    ``lengths``: (q_len, k_len); the queries are the last q_len positions."""
    q_len, k_len = lengths
    bias = BIASES[name][1](heads, dim)
    params = tuple(p for p in bias.parameters() if p.requires_grad)
    gen = torch.Generator().manual_seed(k_len)
    grad = mode != "forward"
    q = torch.randn(batch, heads, q_len, dim, generator=gen).requires_grad_(grad)
    k, v = (torch.randn(batch, heads, k_len, dim, generator=gen).requires_grad_(grad) for _ in range(2))
    calls = {path: timed_call(fn, (q, k, v), params, mode) for path, fn in _paths(bias).items()}
    times = {p: statistics.median(ts) for p, ts in interleaved_times(calls, repeat, warmup=1).items()}
    return {
        "bias": name,
        "family": family,
        "batch": batch,
        "heads": heads,
        "q_len": q_len,
        "seq": k_len,
        "mode": mode,
        "scores": batch * heads * q_len * k_len,
        "materialised_seconds": times["materialised"],
        "blocked_seconds": times["blocked"],
        "blocked_over_materialised": times["blocked"] / times["materialised"],
    }


def run(quick: bool = False, repeat: int | None = None) -> list[dict]:
    """Every (bias, shape, lengths, mode) row; ``quick``: the first lengths of each family only."""
    repeat = repeat or (1 if quick else 5)
    rows = []
    for name, (kind, _, _) in BIASES.items():
        if kind == "content":  # no bias to materialise
            continue
        for family, batch, heads, dim, pairs, modes in SHAPES:
            for lengths in pairs[:1] if quick else pairs:
                for mode in modes:
                    rows.append(measure(name, family, batch, heads, dim, lengths, mode, repeat))
    return rows


def crossover_table(rows: list[dict]) -> str:
    columns = [
        Column("bias", -16, lambda r: r["bias"]),
        Column("shape", -6, lambda r: r["family"]),
        Column("B", 3, lambda r: str(r["batch"])),
        Column("q_len", 5, lambda r: str(r["q_len"])),
        Column("k_len", 5, lambda r: str(r["seq"])),
        Column("mode", -17, lambda r: r["mode"]),
        Column("B*H*q*k", 10, lambda r: str(r["scores"])),
        Column("materialised s", 15, lambda r: number(r["materialised_seconds"], ".4g")),
        Column("blocked s", 10, lambda r: number(r["blocked_seconds"], ".4g")),
        Column("blocked/mat", 12, lambda r: number(r["blocked_over_materialised"], ".2f")),
    ]
    return table("Score biases on the CPU: materialised SDPA against the blocked kernel", columns, rows)
