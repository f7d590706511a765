"""Sliding-window attention at long context: posenc's windowed kernel against the mask transformers builds.

A sliding-window layer (Gemma 3: window 512, 4 query heads, 1 key/value head of 256) attends to the last
``window`` keys. transformers' SDPA path gives it a boolean (1, 1, L, L) mask; posenc patches the layer onto
:func:`posenc.remap.remap_attention` with ``window=``, which walks blocks of queries over the keys inside
the window only (:mod:`posenc.hf.window`). One row per length and case, forward only (inference), batch 1:

* ``posenc``: the windowed kernel on q, k, v;
* ``transformers``: ``sdpa_attention_forward`` with the mask transformers' ``sdpa_mask`` builds for the
  layer (its own code, mask included in the peak), timed round-robin with ``posenc`` in one process.

Past ``MASKED_UP_TO`` the transformers case is not run: its mask alone is L^2 bytes (4 GiB at 65536) and
CPU SDPA with a boolean mask materialises float scores (L^2 x heads x 4 bytes); the row says so. Peak memory
is what the first call added on top of q, k, v; on the CPU each row runs in a fresh process.
"""

from __future__ import annotations

import statistics
import sys

import torch

from .attention import answer_parent, in_child
from .biases import first_call_peak, mib, timed_call
from .report import Column, table
from .timing import interleaved_times

_CPU = torch.device("cpu")
WINDOW, HEADS, KV_HEADS, HEAD_DIM = 512, 4, 1, 256  # Gemma 3 270M's sliding layers
LENGTHS = (4096, 16384, 65536)
MASKED_UP_TO = 16384


class _Layer(torch.nn.Module):
    """What transformers' attention function reads of a layer."""

    def __init__(self):
        super().__init__()
        self.num_key_value_groups = HEADS // KV_HEADS
        self.is_causal = True
        self.training = False


def _cases(seq: int) -> dict:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    from posenc.remap import NoRemap, remap_attention

    layer, scale = _Layer(), HEAD_DIM**-0.5

    def posenc_case(q, k, v):
        return remap_attention(q, k, v, None, NoRemap(), scale=scale, window=WINDOW)

    def transformers_case(q, k, v):
        mask = sdpa_mask(
            1,
            seq,
            seq,
            mask_function=sliding_window_causal_mask_function(WINDOW),
            local_size=WINDOW,
            allow_is_causal_skip=False,
        )
        return sdpa_attention_forward(layer, q, k, v, mask, scaling=scale)[0]

    cases = {"posenc": posenc_case}
    if seq <= MASKED_UP_TO:
        cases["transformers"] = transformers_case
    return cases


def measure(seq: int, repeat: int, device=_CPU) -> dict:
    """One length in this process: the cases round-robin, medians, the first call's peaks."""
    gen = torch.Generator().manual_seed(0)
    shapes = ((1, HEADS, seq, HEAD_DIM), (1, KV_HEADS, seq, HEAD_DIM), (1, KV_HEADS, seq, HEAD_DIM))
    qkv = tuple(torch.randn(s, generator=gen).to(device) for s in shapes)
    peaks: dict[str, int] = {}
    calls = {
        case: first_call_peak(timed_call(fn, qkv, (), "forward"), device, peaks, case)
        for case, fn in _cases(seq).items()
    }
    times = {case: statistics.median(ts) for case, ts in interleaved_times(calls, repeat, 0, device).items()}
    row = {"seconds": times["posenc"], "peak_bytes": peaks["posenc"]}
    if "transformers" in times:
        row.update(
            transformers_seconds=times["transformers"],
            transformers_peak_bytes=peaks["transformers"],
            x_transformers=times["posenc"] / times["transformers"],
        )
    else:
        row["transformers_skipped"] = (
            f"L > {MASKED_UP_TO}: its bool mask alone is {seq * seq / 2**30:.0f} GiB"
        )
    return row


def run(device: torch.device, repeat: int | None = None, lengths=LENGTHS) -> list[dict]:
    """Every length of ``lengths`` (Gemma 3 270M's sliding-layer shape, window 512)."""
    rows = []
    for seq in lengths:
        reps = repeat or (5 if seq <= MASKED_UP_TO else 2)
        row = {"seq": seq, "window": WINDOW, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM}
        row.update(in_child(__name__, seq, reps) if device.type == "cpu" else measure(seq, reps, device))
        rows.append(row)
        print(f"  window L={seq}: done", file=sys.stderr, flush=True)
    return rows


def _theirs(r: dict) -> str:
    if "transformers_seconds" not in r:
        return r.get("transformers_skipped", "")
    return f"{r['transformers_seconds']:.3f} s, {mib(r['transformers_peak_bytes'])} MiB"


COLUMNS = (
    Column("L", 6, lambda r: str(r["seq"])),
    Column("posenc s", 9, lambda r: f"{r['seconds']:.3f}" if "seconds" in r else "-"),
    Column("peak MiB", 9, lambda r: mib(r.get("peak_bytes"))),
    Column("x transformers", 15, lambda r: f"{r['x_transformers']:.2f}" if "x_transformers" in r else "-"),
    Column("transformers (SDPA + its mask)", -40, _theirs),
)


def window_table(rows: list[dict]) -> str:
    """The rows as a table (a row that failed shows why)."""
    title = (
        f"Sliding-window attention, window {WINDOW}, {HEADS} query heads / {KV_HEADS} key-value head of "
        f"{HEAD_DIM}, batch 1, forward, medians (peak = memory added on top of q, k, v)"
    )
    return table(title, COLUMNS, rows, keys=1)


if __name__ == "__main__":
    answer_parent(measure(*map(int, sys.argv[1:3])))
