"""Every training-free remap (:mod:`posenc.remap`) at long context: forward and forward + backward time and
peak memory, against the RoPE attention it replaces.

One row per remap, length and mode, at batch 1, causal, with the preset's heads and head_dim (a quarter as
many key/value heads: grouped-query attention, as in the models these methods serve):

* ``posenc``: ``posenc.attention(q, k, v, rotary=rope, remap=R)``;
* ``rope``: ``posenc.attention(q, k, v, rotary=rope)``, RoPE then causal SDPA, timed round-robin with
  ``posenc`` in the same process so that their ratio (``x_rope``) sees the same load.

Each remap is set for the row's length L as an extension from L / 4 would be: SelfExtend(4, L/8),
ReRoPE(L/8), leaky ReRoPE(L/8, k=4), STRING(L/3, 128), DualChunk(L/4, L/128) (chunks of L/4 - L/128, as
Qwen2.5-1M's proportions). Peak memory is what the first call added on top of
q, k, v; on the CPU each row runs in a fresh process, so its peak is its own.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

import torch

import posenc

from .attention import answer_parent, in_child
from .biases import MODES, first_call_peak, mib, timed_call
from .presets import Preset
from .report import Column, table
from .timing import interleaved_times

_CPU = torch.device("cpu")

REMAPS: dict[str, Callable[[int], posenc.remap.Remap]] = {
    "SelfExtend": lambda seq: posenc.SelfExtend(4, max(1, seq // 8)),
    "ReRoPE": lambda seq: posenc.ReRoPE(max(1, seq // 8)),
    "leaky ReRoPE": lambda seq: posenc.ReRoPE(max(1, seq // 8), leaky=4.0),
    "STRING": lambda seq: posenc.STRING(max(1, seq // 3), min(128, max(1, seq // 3))),
    "DualChunk": lambda seq: posenc.DualChunk(max(2, seq // 4), max(1, seq // 128)),
}


def _inputs(seq: int, heads: int, dim: int, grad: bool, device) -> tuple:
    gen = torch.Generator().manual_seed(0)
    kv = max(1, heads // 4)
    shapes = ((1, heads, seq, dim), (1, kv, seq, dim), (1, kv, seq, dim))
    return tuple(torch.randn(s, generator=gen).to(device).requires_grad_(grad) for s in shapes)


def measure(name: str, mode: str, seq: int, heads: int, dim: int, repeat: int, device=_CPU) -> dict:
    """One row in this process: ``posenc`` with the remap round-robin with plain RoPE attention."""
    if name not in REMAPS:
        raise ValueError(f"remap must be one of {tuple(REMAPS)}, got {name!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rope = posenc.RotaryEmbedding(dim, layout="half")

    def cases(length: int) -> dict[str, Callable]:
        remap = REMAPS[name](length)
        return {
            "posenc": lambda q, k, v: posenc.attention(q, k, v, rotary=rope, remap=remap),
            "rope": lambda q, k, v: posenc.attention(q, k, v, rotary=rope),
        }

    grad = mode != "forward"
    for fn in cases(256).values():  # load kernels and thread pools first
        timed_call(fn, _inputs(256, heads, dim, grad, device), (), mode)()
    fns = cases(seq)
    qkv = _inputs(seq, heads, dim, grad, device)
    peaks: dict[str, int] = {}
    calls = {
        case: first_call_peak(timed_call(fn, qkv, (), mode), device, peaks, case) for case, fn in fns.items()
    }
    times = {case: statistics.median(ts) for case, ts in interleaved_times(calls, repeat, 0, device).items()}
    return {
        "seconds": times["posenc"],
        "peak_bytes": peaks["posenc"],
        "rope_seconds": times["rope"],
        "rope_peak_bytes": peaks["rope"],
        "x_rope": times["posenc"] / times["rope"],
        "parameters": repr(REMAPS[name](seq)),
    }


def run(preset: Preset, device: torch.device, repeat: int | None = None, lengths=None) -> list[dict]:
    """Every remap of :data:`REMAPS` at ``lengths`` (default the preset's ``bias_lengths``), both modes."""
    rows = []
    heads, dim = preset.heads, preset.head_dim
    for seq in preset.bias_lengths if lengths is None else lengths:
        reps = repeat or preset.attention_repeat
        reps = reps if seq < 16384 else max(1, min(reps, 3))
        for mode in MODES:
            for name in REMAPS:
                row = {"remap": name, "seq": seq, "mode": mode, "heads": heads, "head_dim": dim}
                if device.type == "cpu":
                    row.update(in_child(__name__, name, mode, seq, heads, dim, reps))
                else:
                    row.update(measure(name, mode, seq, heads, dim, reps, device))
                rows.append(row)
                print(f"  remap {name} L={seq} {mode}: done", file=sys.stderr, flush=True)
    return rows


COLUMNS = (
    Column("remap", -13, lambda r: r["remap"]),
    Column("L", 6, lambda r: str(r["seq"])),
    Column("mode", -17, lambda r: r["mode"]),
    Column("seconds", 9, lambda r: f"{r['seconds']:.3f}"),
    Column("x RoPE", 7, lambda r: f"{r['x_rope']:.2f}"),
    Column("peak MiB", 9, lambda r: mib(r["peak_bytes"])),
    Column("RoPE s", 8, lambda r: f"{r['rope_seconds']:.3f}"),
    Column("RoPE MiB", 9, lambda r: mib(r["rope_peak_bytes"])),
)


def remap_table(rows: list[dict]) -> str:
    """The rows as a table (a row that failed shows why)."""
    title = (
        "Remapped-distance attention, batch 1, causal, GQA 4:1, medians (x RoPE = time / RoPE + causal SDPA, "
        "timed round-robin in one process; peak = memory added on top of q, k, v)"
    )
    return table(title, COLUMNS, rows, keys=3)


if __name__ == "__main__":
    name, mode = sys.argv[1], sys.argv[2]
    answer_parent(measure(name, mode, *map(int, sys.argv[3:7])))
