"""What a comparison writes: the markdown tables, results.json, details.json, results.md and the plot
(drawn by :mod:`posenc.lab.figure`).

Rows are the JSON form of :class:`posenc.lab.evaluate.Row` (:meth:`Row.to_dict`): ``"scheme"``, one dict
per measure of :data:`posenc.lab.measures.MEASURES` (``"ppl"``, ``"ppl_past"``, ``"ppl_sliding"``,
``"gain"``, ``"copy_first"``, ``"copy_repeat"``, ``"passkey"``) with values keyed by the length as a
string (None where not measurable), and ``"note"``. ``posenc compare`` combines the seeds of each row
(:func:`posenc.lab.stats.combine_seeds`: means, ``"<name>_sd"``, ``"seeds"``, ``"per_seed"``) and adds its
timings (``train_s``, ``eval_s``). A table cell reads ``mean ± sd`` when there is a spread to show.
"""

from __future__ import annotations

import json
from pathlib import Path

from posenc.lab.config import Settings
from posenc.lab.defaults import PASSKEY_DIGITS, PASSKEY_STYLE
from posenc.lab.figure import extrapolation_figure
from posenc.lab.measures import BY_LENGTH, measured
from posenc.lab.mix import parse_mix
from posenc.lab.recipes import RECIPES
from posenc.lab.stats import pooled_wilson
from posenc.runs.figures import save_figure
from posenc.runs.files import write_text_atomic
from posenc.runs.tables import grid_table

__all__ = [
    "copy_table",
    "extrapolation_figure",
    "gain_table",
    "markdown_table",
    "passkey_table",
    "past_table",
    "ratio",
    "recall_table",
    "results_payload",
    "sliding_table",
    "write_reports",
]


def ratio(row: dict, num: int, den: int) -> float | None:
    """ppl(num) / ppl(den) of a row (the means, for a multi-seed row), or None when either is missing."""
    a, b = row["ppl"].get(str(num)), row["ppl"].get(str(den))
    return a / b if a is not None and b is not None else None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _cell(row: dict, name: str, n: int, digits: int = 2) -> str:
    """``row[name]`` at length ``n``, with ``± sd`` when the row has a seed spread there."""
    value = row.get(name, {}).get(str(n))
    sd = row.get(f"{name}_sd", {}).get(str(n))
    if value is None or sd is None:
        return _fmt(value, digits)
    return f"{value:.{digits}f} ± {sd:.{digits}f}"


def _length_head(n: int, train_len: int, what: str = "ppl") -> str:
    return f"{what}@{n} ({n // train_len}x)" if n % train_len == 0 else f"{what}@{n}"


def markdown_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """The windows protocol's table: perplexity at each length, and ppl(4L)/ppl(L) when 4L was evaluated."""
    has4 = 4 * train_len in eval_lens
    head = ["scheme"] + [_length_head(n, train_len) for n in eval_lens]
    head += ["ppl(4L)/ppl(L)"] if has4 else []
    head += ["note"]
    body = []
    for r in rows:
        cells = [r["scheme"]] + [_cell(r, "ppl", n) for n in eval_lens]
        if has4:
            cells.append(_fmt(ratio(r, 4 * train_len, train_len), 3))
        cells.append((r.get("note") or "").replace("|", "/"))
        body.append(cells)
    return grid_table(head, body, text_columns=2)


def past_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """Perplexity on positions at or past ``train_len`` only, at each longer length ("" when none is)."""
    longer = [n for n in eval_lens if n > train_len]
    if not longer:
        return ""
    head = ["scheme"] + [f"ppl past {train_len} @{n}" for n in longer]
    body = [[r["scheme"]] + [_cell(r, "ppl_past", n) for n in longer] for r in rows]
    return grid_table(head, body, text_columns=1)


def sliding_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """The sliding protocol: ppl of the last ``train_len`` tokens of windows at stride ``train_len``."""
    head = ["scheme"] + [_length_head(n, train_len) for n in eval_lens]
    body = [[r["scheme"]] + [_cell(r, "ppl_sliding", n) for n in eval_lens] for r in rows]
    return grid_table(head, body, text_columns=1)


def gain_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """Far-context gain ppl(last-L context) / ppl(full context) at each length past ``train_len``."""
    longer = [n for n in eval_lens if n > train_len]
    if not longer:
        return ""
    head = ["scheme"] + [_length_head(n, train_len, "gain") for n in longer]
    body = [[r["scheme"]] + [_cell(r, "gain", n, 3) for n in longer] for r in rows]
    return grid_table(head, body, text_columns=1)


def reach_table(rows: list[dict], train_len: int) -> str:
    """Far-context gain inside the training length: per context c, ppl(last c as context) / ppl(window of
    the training length) ("" when it was not measured)."""
    contexts = sorted({int(c) for r in rows for c in (r.get("reach") or {})})
    if not contexts:
        return ""
    head = ["scheme"] + [f"reach@{c} (L/{train_len // c})" for c in contexts]
    body = [[r["scheme"]] + [_cell(r, "reach", c, 3) for c in contexts] for r in rows]
    return grid_table(head, body, text_columns=1)


def copy_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """The copy probe: perplexity on a segment's first occurrence and on its repeat, at each length where it
    was measured ("" when none)."""
    eval_lens = [n for n in eval_lens if any(r.get("copy_first", {}).get(str(n)) is not None for r in rows)]
    if not eval_lens:
        return ""
    head = ["scheme"]
    for n in eval_lens:
        head += [f"first @{n}", f"repeat @{n}"]
    body = []
    for r in rows:
        cells = [r["scheme"]]
        for n in eval_lens:
            cells += [_cell(r, "copy_first", n), _cell(r, "copy_repeat", n)]
        body.append(cells)
    return grid_table(head, body, text_columns=1)


def recall_table(rows: list[dict], eval_lens: list[int], train_len: int) -> str:
    """The recall probe at each length where it was measured: accuracy, ppl on the value bytes, and the
    far-context gain on them ("" when none was measured)."""
    eval_lens = [n for n in eval_lens if any(r.get("recall", {}).get(str(n)) is not None for r in rows)]
    if not eval_lens:
        return ""
    head = ["scheme"]
    for n in eval_lens:
        head += [_length_head(n, train_len, "recall"), f"ppl @{n}", f"gain @{n}"]
    body = []
    for r in rows:
        cells = [r["scheme"]]
        for n in eval_lens:
            cells += [_cell(r, "recall", n), _cell(r, "recall_ppl", n), _cell(r, "recall_gain", n, 3)]
        body.append(cells)
    return grid_table(head, body, text_columns=1)


def passkey_table(rows: list[dict], eval_lens: list[int], train_len: int, trials: int) -> str:
    """Passkey accuracy at each length where it was measured, with its 95% Wilson interval over the
    ``trials`` prompts of every seed together ("" when none was measured)."""
    eval_lens = [n for n in eval_lens if any(r.get("passkey", {}).get(str(n)) is not None for r in rows)]
    if not eval_lens:
        return ""
    head = ["scheme"] + [_length_head(n, train_len, "passkey") for n in eval_lens]
    body = []
    for r in rows:
        cells = [r["scheme"]]
        for n in eval_lens:
            accuracy = r.get("passkey", {}).get(str(n))
            if accuracy is None:
                cells.append("n/a")
                continue
            low, high = pooled_wilson(r, accuracy, trials)
            cells.append(f"{accuracy:.2f} [{low:.2f}, {high:.2f}]")
        body.append(cells)
    return grid_table(head, body, text_columns=1)


def results_payload(
    settings: Settings, rows: list[dict], corpus: str, provenance: dict | None = None
) -> dict:
    """The content of results.json: train_len, eval_lens, corpus, seeds, protocols, provenance, and per
    row its scheme, seeds, each measure (mean over seeds) with its ``_sd``, the per-seed values and note."""
    eval_lens = settings.eval_lens
    names = measured(settings.protocols, settings.probe_windows, settings.passkey_trials)
    keys = {name: [str(n) for n in eval_lens] if name in BY_LENGTH else None for name in names}

    def cells(values: dict, name: str) -> dict:  # every length, None where missing; contexts as measured
        return {k: values.get(k) for k in keys[name]} if keys[name] is not None else dict(values)

    def row(r: dict) -> dict:
        out = {"scheme": r["scheme"], "seeds": r.get("seeds", 1)}
        for name in names:
            out[name] = cells(r.get(name, {}), name)
            out[f"{name}_sd"] = cells(r.get(f"{name}_sd", {}), name)
        if "per_seed" in r:
            out["per_seed"] = {
                seed: {name: cells(values[name], name) for name in names if name in values}
                for seed, values in r["per_seed"].items()
            }
        out["note"] = r["note"]
        return out

    return {
        "train_len": settings.train_len,
        "eval_lens": eval_lens,
        "corpus": corpus,
        "seeds": settings.seeds,
        "protocols": list(settings.protocols),
        "passkey_trials": settings.passkey_trials,
        "provenance": provenance,
        "results": [row(r) for r in rows],
    }


def _results_md(s: Settings, rows: list[dict], corpus: str, device: str, wall_s: float, table: str) -> str:
    seeds = f"seed {s.seed}" if s.seeds == 1 else f"seeds {s.seed}..{s.seed + s.seeds - 1}, mean ± sd"
    md = [
        "# posenc compare: train short, test long",
        "",
        f"Trained at length {s.train_len} on `{corpus}` for {s.steps} steps of {s.batch_size} sequences "
        f"({s.n_layer} layers, d={s.d_model}, {s.n_head} heads, {seeds}); perplexity in bytes. "
        f"scheme+X: eval-time extension at factor = length / {s.train_len}. "
        f"Wall time {wall_s:.0f} s on {device}.",
        "",
    ]
    md += _recipe_section(s) + _protocol_sections(s, rows, table) + _probe_sections(s, rows)
    md += _passkey_section(s, rows)
    return "\n".join(md)


def _mix_words(s: Settings) -> str:
    """The training mix and its answer weight in words ("" for none)."""
    if not s.mix:
        return ""
    weight = f", its answer bytes weighted {s.answer_weight:g}x" if s.answer_weight != 1 else ""
    return f"mix {s.mix}{weight}"


def _recipe_section(s: Settings) -> list[str]:
    """What the ``scheme~recipe`` rows are, and what they cost (compute-matched), when there are any."""
    if not s.extend_steps or not any(s.recipes_for(sc) for sc in s.schemes):
        return []
    tokens = s.batch_size * s.train_len
    lines = [
        f"scheme~R: the trained model continued for {s.extend_steps} more steps towards {s.extend_to} x "
        f"{s.train_len} = {s.extend_to * s.train_len} tokens with extension recipe R, compute-matched: every "
        f"recipe sees {tokens} tokens per step ({s.batch_size // s.extend_to} sequences of "
        f"{s.extend_to * s.train_len} at the target length, or {s.batch_size} of {s.train_len} at the "
        f"training length), {100 * s.extend_steps / s.steps:.0f}% of the base training's tokens:",
        "",
    ]
    lines += [f"- `{name}`: {RECIPES[name].meaning}" for name in s.recipes]
    return lines + [""]


def _protocol_sections(s: Settings, rows: list[dict], table: str) -> list[str]:
    """The markdown of the windows, sliding and past protocols that ``s`` asks for."""
    lens, L = s.eval_lens, s.train_len
    md = []
    if "windows" in s.protocols:
        md += [
            f"Protocol `windows`: non-overlapping windows of each length, every token scored, the same "
            f"{s.eval_tokens} tokens at every length:",
            "",
            table,
            "",
        ]
    if "sliding" in s.protocols:
        md += [
            f"Protocol `sliding`: windows of each length at stride {L}, only their last {L} tokens scored "
            f"(each with at least length - {L - 1} tokens of context), the same {s.sliding_tokens} tokens "
            f"at every length:",
            "",
            sliding_table(rows, lens, L),
            "",
        ]
    past = past_table(rows, lens, L)
    if "past" in s.protocols and past:
        md += [f"Protocol `past`: the windows protocol on positions at or past {L} only:", "", past, ""]
    return md


def _probe_sections(s: Settings, rows: list[dict]) -> list[str]:
    """The markdown of the far-context-gain and copy probes, when ``s`` runs them."""
    lens, L = s.eval_lens, s.train_len
    md = []
    gain = gain_table(rows, lens, L)
    if s.probe_windows and gain:
        md += [
            f"Far-context gain: ppl with only the last {L} tokens as context / ppl with the whole window, on "
            f"the last {min(32, L)} tokens of {s.probe_windows} windows (above 1: tokens farther back than "
            f"{L} help; 1: the model acts like a window of {L}; below 1: they hurt):",
            "",
            gain,
            "",
        ]
    reach = reach_table(rows, L) if s.probe_windows else ""
    if reach:
        md += [
            f"Far-context gain inside the training length: ppl with only the last c tokens as context / ppl "
            f"with the whole window of {L}, on the last {min(32, L // 4)} tokens of the same windows (near 1 "
            f"at c = L/4: the model reads no farther back than a quarter of what it was trained on):",
            "",
            reach,
            "",
        ]
    copies = copy_table(rows, lens, L) if s.probe_windows else ""
    if copies:
        md += [
            f"Copy probe: {s.probe_windows} windows whose second half repeats the first, at lengths up to "
            f"2 x {L}; perplexity on the first occurrence of the repeated bytes and on their repeat (a model "
            f"that copies does far better on the repeat):",
            "",
            copies,
            "",
        ]
    recall = recall_table(rows, lens, L) if s.probe_windows else ""
    if recall:
        md += [
            f"Recall probe: {s.probe_windows} windows per length of text with key-value pairs `$ab=Q7K2` in "
            f"the first quarter and their keys asked at the end (at n >= 2 x {L}, distances in (n/2, n]); "
            f"the share of queries answered exactly, ppl on the value bytes, and ppl with only the last {L} "
            "tokens as context / ppl with the whole window on them (above 1: the far pairs are read; "
            f"trained with {_mix_words(s) or 'no mix: expect 0 and ~1'}):",
            "",
            recall,
            "",
        ]
    return md


def _passkey_section(s: Settings, rows: list[dict]) -> list[str]:
    """The markdown of passkey retrieval, when ``s`` asks for it and some length fits the prompt."""
    keys = passkey_table(rows, s.eval_lens, s.train_len, s.passkey_trials) if s.passkey_trials else ""
    if not keys:
        return []
    if s.passkey_fraction:
        trained = f" (trained with a passkey share of {s.passkey_fraction})"
    elif "passkey" in parse_mix(s.mix):
        trained = f" (trained with {_mix_words(s)})"
    else:
        trained = " (trained without passkey prompts: expect 0, see docs/lab.md)"
    return [
        f"Passkey retrieval: {s.passkey_trials} prompts per length{' and seed' if s.seeds > 1 else ''}, "
        f"a {PASSKEY_DIGITS}-digit key hidden at a random depth of validation text in a "
        f"{PASSKEY_STYLE!r} prompt, answered exactly by greedy decoding; accuracy [95% Wilson "
        f"interval]{' over all seeds' if s.seeds > 1 else ''}" + trained + ":",
        "",
        keys,
        "",
    ]


def write_reports(
    out: Path,
    settings: Settings,
    rows: list[dict],
    *,
    corpus: str,
    device: str,
    wall_s: float,
    provenance: dict | None = None,
) -> str:
    """Write results.json, details.json, results.md and extrapolation.png into ``out``; returns the table."""
    payload = results_payload(settings, rows, corpus, provenance)
    write_text_atomic(out / "results.json", json.dumps(payload, indent=2))
    details = {"settings": settings.to_json(), "device": device, "wall_s": round(wall_s, 1), "rows": rows}
    write_text_atomic(out / "details.json", json.dumps(details, indent=2))
    table = markdown_table(rows, settings.eval_lens, settings.train_len)
    write_text_atomic(out / "results.md", _results_md(settings, rows, corpus, device, wall_s, table))
    save_figure(extrapolation_figure(payload), out / "extrapolation.png")
    return table
