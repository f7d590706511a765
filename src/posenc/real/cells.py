"""Where ``posenc extend`` keeps its work: one cell per schedule and length, saved after every forward pass.

A cell (``<out>/cells/<length>-<digest>.json``) holds the results of one way of running the model (a
:class:`~posenc.real.methods.Treatment`'s digest: every layer's frequencies at that length, its remap,
temperature and scale) at one length, keyed by the model, dtype and device type; each result in it by
what it scored (a window's tokens, a trial's prompt and questions). Two methods that run the model the same
way at a length (dynamic NTK inside the trained length is the model as trained) share one cell, and a
rerun, or one with more windows, trials or methods, computes only what is missing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from posenc.runs.files import write_text_atomic

__all__ = ["CELL_VERSION", "Cell", "cells_for", "model_digest"]

CELL_VERSION = 1


class Cell:
    """The saved results of one schedule at one length: ``items`` by key, written after each addition.
    ``first``: the first method (in the run's order) that runs this way."""

    def __init__(self, path: Path, key: dict, first: str):
        self.path, self.key = path, key
        self.first = first
        self.items: dict[str, dict] = {}
        if path.is_file():
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                saved = {}
            if saved.get("key") == key:  # results of another model, dtype or schedule are not reused
                self.items = saved.get("items", {})

    def add(self, item: str, result: dict) -> None:
        self.items[item] = result
        write_text_atomic(self.path, json.dumps({"key": self.key, "items": self.items}))


def model_digest(info: dict) -> str:
    """The model's identity in a cell's key: its folder's files, sizes and modification times."""
    folder = Path(info["folder"])
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]


def cells_for(out: Path, info: dict, model, treatments: dict, lengths, refused: dict) -> dict:
    """(method, length) -> its :class:`Cell`, shared by the methods whose treatments coincide there; None
    where the method cannot run at that length (``refused``: (method, length) -> why)."""
    param = next(model.parameters())
    base = {"version": CELL_VERSION, "model": model_digest(info), "dtype": str(param.dtype)}
    base["device"] = param.device.type
    made: dict[tuple[str, int], Cell] = {}
    cells: dict[tuple[str, int], Cell | None] = {}
    for m, treatment in treatments.items():
        for n in lengths:
            if (m, n) in refused:
                cells[m, n] = None
                continue
            digest = treatment.digest(n)
            if (digest, n) not in made:
                key = {**base, "schedule": digest, "length": n}
                made[digest, n] = Cell(out / "cells" / f"{n}-{digest}.json", key, m)
            cells[m, n] = made[digest, n]
    return cells
