"""What a comparison writes: the markdown tables, results.json, details.json, results.md and the plot.

Rows are the JSON form of :class:`posenc.lab.evaluate.Row` (:meth:`Row.to_dict`): ``{"scheme", "ppl",
"ppl_past", "note"}`` with perplexities keyed by the length as a string, None where not measurable;
``posenc compare`` adds its timings (``train_s``, ``eval_s``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from posenc.lab.checkpoint import write_text_atomic
from posenc.lab.config import Settings

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "extrapolation_figure",
    "markdown_table",
    "past_table",
    "ratio",
    "results_payload",
    "save_figure",
    "write_reports",
]


def ratio(row: dict, num: int, den: int) -> float | None:
    """ppl(num) / ppl(den) of a row, or None when either is missing."""
    a, b = row["ppl"].get(str(num)), row["ppl"].get(str(den))
    return a / b if a is not None and b is not None else None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _table(head: list[str], rows: list[list[str]], text_columns: int) -> str:
    """A markdown table: the first column and the last ``text_columns - 1`` left-aligned, numbers right."""
    numbers = len(head) - text_columns
    align = ["---"] + ["---:"] * numbers + ["---"] * (text_columns - 1)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def markdown_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """The main table: perplexity at each length, and ppl(4L)/ppl(L) when 4L was evaluated."""
    has4 = 4 * train_len in eval_lens
    head = ["scheme"] + [
        f"ppl@{n} ({n // train_len}x)" if n % train_len == 0 else f"ppl@{n}" for n in eval_lens
    ]
    head += ["ppl(4L)/ppl(L)"] if has4 else []
    head += ["note"]
    body = []
    for r in rows:
        cells = [r["scheme"]] + [_fmt(r["ppl"].get(str(n))) for n in eval_lens]
        if has4:
            cells.append(_fmt(ratio(r, 4 * train_len, train_len), 3))
        cells.append((r.get("note") or "").replace("|", "/"))
        body.append(cells)
    return _table(head, body, text_columns=2)


def past_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """Perplexity on positions at or past ``train_len`` only, at each longer length ("" when none is)."""
    longer = [n for n in eval_lens if n > train_len]
    if not longer:
        return ""
    head = ["scheme"] + [f"ppl past {train_len} @{n}" for n in longer]
    body = [[r["scheme"]] + [_fmt(r["ppl_past"].get(str(n))) for n in longer] for r in rows]
    return _table(head, body, text_columns=1)


def results_payload(settings: Settings, rows: list[dict], corpus: str) -> dict:
    """The content of results.json: train_len, eval_lens, corpus, and per row scheme, ppl and note."""
    eval_lens = settings.eval_lens
    return {
        "train_len": settings.train_len,
        "eval_lens": eval_lens,
        "corpus": corpus,
        "results": [
            {
                "scheme": r["scheme"],
                "ppl": {str(n): r["ppl"].get(str(n)) for n in eval_lens},
                "note": r["note"],
            }
            for r in rows
        ],
    }


def _results_md(s: Settings, rows: list[dict], corpus: str, device: str, wall_s: float, table: str) -> str:
    md = [
        "# posenc compare: train short, test long",
        "",
        f"Trained at length {s.train_len} on `{corpus}` for {s.steps} steps of {s.batch_size} sequences "
        f"({s.n_layer} layers, d={s.d_model}, {s.n_head} heads, seed {s.seed}); perplexity (bytes) on "
        f"non-overlapping validation windows of each length, {s.eval_tokens} tokens per length. "
        f"rope+X: eval-time extension at factor = length / {s.train_len}. "
        f"Wall time {wall_s:.0f} s on {device}.",
        "",
        table,
        "",
    ]
    past = past_table(rows, s.eval_lens, s.train_len)
    if past:
        md += ["Perplexity on positions at or past the training length only:", "", past, ""]
    return "\n".join(md)


def write_reports(
    out: Path, settings: Settings, rows: list[dict], *, corpus: str, device: str, wall_s: float
) -> str:
    """Write results.json, details.json, results.md and extrapolation.png into ``out``; returns the table."""
    payload = results_payload(settings, rows, corpus)
    write_text_atomic(out / "results.json", json.dumps(payload, indent=2))
    details = {"settings": settings.to_json(), "device": device, "wall_s": round(wall_s, 1), "rows": rows}
    write_text_atomic(out / "details.json", json.dumps(details, indent=2))
    table = markdown_table(rows, settings.eval_lens, settings.train_len)
    write_text_atomic(out / "results.md", _results_md(settings, rows, corpus, device, wall_s, table))
    save_figure(extrapolation_figure(payload), out / "extrapolation.png")
    return table


def extrapolation_figure(payload: dict) -> Figure:
    """Perplexity vs evaluation length (log-log), one line per scheme, the training length marked.

    ``payload`` is the content of results.json. Extensions (``rope+X``) are dashed; schemes with no
    finite perplexity are left out. The figure is not attached to pyplot, so nothing global changes.
    """
    from matplotlib.figure import Figure  # the lab's optional dependency, imported when used

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for r in payload["results"]:
        pts = [(int(n), v) for n, v in r["ppl"].items() if v is not None and math.isfinite(v)]
        if not pts:
            continue
        xs, ys = zip(*sorted(pts), strict=True)
        style = "--" if "+" in r["scheme"] else "-"
        ax.plot(xs, ys, style, marker="o", label=r["scheme"])
    ax.axvline(payload["train_len"], color="grey", lw=1, ls=":", label=f"train length {payload['train_len']}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (bytes)")
    ax.set_title("Length extrapolation: trained short, evaluated long")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: Path) -> None:
    """Write ``fig`` as a PNG at 120 dpi, replacing ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
