"""What running a real model through posenc costs: ``none`` (the model as trained, every position computed by
posenc, a planned model's sliding layers on the windowed kernel) against the unpatched model's own forward.

One row per shipped model that is installed (:mod:`posenc.real.shipped`), at one length: the whole model's
forward (no gradients, float32), patched and unpatched timed round-robin in one process so that both see
the same load; ``x_unpatched`` is the ratio of their medians. SmolLM2 runs at its trained length (8192);
Gemma 3 at 8192 too (its trained 32768 takes minutes per forward on a CPU), where 7680 of the keys of each
sliding layer lie outside its window of 512.
"""

from __future__ import annotations

import statistics
import sys

import torch

from .report import Column, table
from .timing import interleaved_times

LENGTHS = {"smollm2-135m": 8192, "gemma3-270m": 8192}


def measure(name: str, length: int, repeat: int, device: torch.device) -> dict:
    """One model: the patched and unpatched forward of ``length`` tokens of real text, round-robin."""
    from posenc.hf import patch_model, unpatch_model
    from posenc.real.corpus import load_documents
    from posenc.real.loader import load_real_model

    plain = load_real_model(name, device=device)  # two copies: one patched once, outside the timing
    ours = load_real_model(name, device=device)
    patch_model(ours.model)
    docs = load_documents(None, plain.tokenizer, length, enough=1)
    ids = torch.tensor([[int(t) for t in docs[0].tokens[:length]]], device=device)

    def forward(model):
        def call():
            with torch.inference_mode():
                return model(input_ids=ids, logits_to_keep=1)

        return call

    patched, unpatched = forward(ours.model), forward(plain.model)
    times = interleaved_times({"posenc": patched, "unpatched": unpatched}, repeat, 0, device)
    unpatch_model(ours.model)
    medians = {case: statistics.median(ts) for case, ts in times.items()}
    return {
        "seconds": medians["posenc"],
        "unpatched_seconds": medians["unpatched"],
        "x_unpatched": medians["posenc"] / medians["unpatched"],
    }


def run(device: torch.device, repeat: int | None = None) -> list[dict]:
    """Every installed shipped model at its length of :data:`LENGTHS`."""
    import importlib.util

    from posenc.real.shipped import SHIPPED

    rows = []
    for name, length in LENGTHS.items():
        row = {"model": name, "seq": length}
        if any(importlib.util.find_spec(package) is None for package, _ in SHIPPED[name].parts):
            row["skipped"] = f"not installed: {SHIPPED[name].install}"
        else:
            row.update(measure(name, length, repeat or 3, device))
        rows.append(row)
        print(f"  overhead {name} L={length}: done", file=sys.stderr, flush=True)
    return rows


COLUMNS = (
    Column("model", -14, lambda r: r["model"]),
    Column("L", 6, lambda r: str(r["seq"])),
    Column("posenc s", 9, lambda r: f"{r['seconds']:.2f}" if "seconds" in r else r.get("skipped", "-")),
    Column("unpatched s", 12, lambda r: f"{r['unpatched_seconds']:.2f}" if "seconds" in r else "-"),
    Column("x unpatched", 12, lambda r: f"{r['x_unpatched']:.3f}" if "seconds" in r else "-"),
)


def overhead_table(rows: list[dict]) -> str:
    """The rows as a table."""
    title = "A real model's forward through posenc (none) against the unpatched model, float32, medians"
    return table(title, COLUMNS, rows, keys=1)
