"""What ``posenc extend`` writes: results.json, results.md (tables and a factual summary) and extend.png.

The payload (built by :mod:`posenc.real.extend`)::

    {"model": {...}, "train_len": int, "factor": float, "lengths": [...], "score_tokens": int,
     "short_tokens": int, "short_length": int | None, "corpus": {"path", "windows": [{"document", "end"}]},
     "passkey": {"trials", "digits", "seed", "chat_template"},
     "results": [{"method", "description", "scaling", "ppl": {"<len>": float}, "ppl_all": {...},
                  "longppl": {"<len>": float}, "longppl_keys": int | None, "ppl_short": float,
                  "passkey": {"<len>": float | None}, "passkey_hits", "passkey_ci95",
                  "passkey_trials": {"<len>": [{"depth", "key", "hit", "answer"}]},
                  "ppl_by_context": {"<len>": [[start, end, ppl], ...]}, "same_as": {"<len>": method},
                  "not_applicable": {"<len>": why}, "remap": repr | None, "seconds", "seconds_by_length",
                  "peak_mib"}],
     "provenance": {...}}

     "trials": [{"method", "length", "task", "trial", "depth", "score", "hit", "answer", "haystack",
                 "logprob", "control_logprob", "gain", "gold_tokens"}],
     "trial_costs": {"<len>": {"forwards", "questions", "prefill_s", "shared_s", "control_s", "trial_s",
                               "question_s"}},
     "tasks": {"names", "titles", "trials", "questions", "seed", "chat_template", "haystacks", "ladder",
               "baseline_within"},
     "budget", "layers",
     "provenance": {...}}

Values are None where not measured (yet: a running or killed run writes what is done). With ``"trials"``
(every method's score on the same trials) the report adds per-task scores with their intervals, every two
methods' paired comparison, the needle's gains and their paired comparison (:mod:`.gains`), the effective
lengths, and suggests a method from them (:mod:`.pairs`); without
(a results.json written before trials were), the tables and the rule of point estimates as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from posenc.real import pairs
from posenc.real.gains import Gains, gain_comparisons_section, gain_facts, gains_section
from posenc.runs.figures import save_figure
from posenc.runs.files import write_text_atomic
from posenc.runs.tables import grid_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["extend_figure", "markdown", "suggestion", "summary", "write"]


PENDING = "not run yet"


def _num(v: float | None, digits: int = 2, missing: str = "n/a") -> str:
    if v is None:
        return missing
    return f"{v:.{digits}f}" if v < 1000 else f"{v:,.0f}"


def _missing(row: dict, n) -> str:
    """What an empty cell of ``row`` at length ``n`` says: not applicable there, or not measured yet (a run
    that stopped before it; running the command again continues)."""
    return "n/a" if str(n) in row.get("not_applicable", {}) else PENDING


NOT_ASKED = "not asked"  # the protocol asks the tasks of the model as trained alone there


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _mult(n: int, train_len: int) -> str:
    return f"{n / train_len:g}x"


def _passkey_cell(row: dict, n: int) -> str:
    key = str(n)
    if row["passkey"].get(key) is None:
        return _missing(row, n)
    lo, hi = row["passkey_ci95"][key]
    return f"{row['passkey'][key]:.2f} [{lo:.2f}, {hi:.2f}]"


def _relative(v: float | None, ref: float | None) -> str:
    if v is None or ref is None:
        return "n/a"
    return f"{v:.2f} ({100 * (v / ref - 1):+.1f}%)"


def markdown(payload: dict) -> str:
    """The report: what was run, the tables, the summary."""
    m, L = payload["model"], payload["train_len"]
    lines = [
        f"# posenc extend: {m['name']}",
        "",
        f"{m['model_type']}, {m['parameters'] / 1e6:.1f}M parameters, trained at {L} tokens; {m['dtype']} on "
        f"{m['device']}. Extension factor {payload['factor']:g} (the longest length over the trained "
        f"length). {_count(len(payload['corpus']['windows']), 'window')} per length, from "
        f"{payload['corpus']['path'] or 'the Python standard library'}, ending at the same tokens at every "
        f"length.",
        "",
    ]
    lines += _perplexity_section(payload) + _passkey_section(payload) + _trials_sections(payload)
    lines += _cost_section(payload) + _context_section(payload)
    rows = payload["results"]
    facts = summary(payload)
    if facts:
        lines += ["", "## Summary", "", *(f"- {f}" for f in facts)]
    lines += ["", "## Methods", "", *(f"- **{r['method']}**: {r['description']}" for r in rows)]
    if any(PENDING in line for line in lines):
        lines += [
            "",
            f"Cells that read '{PENDING}': the run stopped before measuring them; the same command again "
            "continues from its saved work.",
        ]
    return "\n".join(lines) + "\n"


def _perplexity_section(payload: dict) -> list[str]:
    L, rows, lengths = payload["train_len"], payload["results"], payload["lengths"]
    head = ["method"] + [f"ppl@{n} ({_mult(n, L)})" for n in lengths]
    body = [[r["method"]] + [_num(r["ppl"][str(n)], 2, _missing(r, n)) for n in lengths] for r in rows]
    return [
        f"## Perplexity of the last {payload['score_tokens']} tokens of each window (the same tokens at "
        "every length)",
        "",
        grid_table(head, body, 1),
        *_longppl_section(payload),
    ]


def _longppl_section(payload: dict) -> list[str]:
    """LongPPL on the key tokens the model as trained picked, when they were measured."""
    L, rows, lengths = payload["train_len"], payload["results"], payload["lengths"]
    keys = next((r.get("longppl_keys") for r in rows if r.get("longppl_keys") is not None), None)
    if keys is None:
        return []
    head = ["method"] + [f"LongPPL@{n} ({_mult(n, L)})" for n in lengths]
    body = [
        [r["method"]] + [_num(r["longppl"].get(str(n)), 2, _missing(r, n)) for n in lengths] for r in rows
    ]
    return [
        "",
        f"### LongPPL: the same windows' {keys} key tokens (Fang et al. 2024, arXiv:2410.23771)",
        "",
        f"Key tokens: of those final tokens, the ones the model as trained predicts with its whole {L}-token "
        f"window at least 2 nats better than with the last {L // 4} tokens before them, and with a loss "
        "under 2 nats (LongPPL's thresholds); every method at every length is scored on those same tokens.",
        "",
        grid_table(head, body, 1)
        if keys
        else "No token of these windows is a key token: LongPPL is undefined.",
    ]


def _passkey_section(payload: dict) -> list[str]:
    L, rows, lengths, pk = payload["train_len"], payload["results"], payload["lengths"], payload["passkey"]
    if not pk["trials"]:
        return []
    how = "in the model's chat template" if pk["chat_template"] else "as plain text"
    head = ["method"] + [f"passkey@{n} ({_mult(n, L)})" for n in lengths]
    return [
        "",
        f"## Passkey retrieval: accuracy [95% Wilson interval] of {pk['trials']} prompts per length",
        "",
        f"A {pk['digits']}-digit key at evenly spaced depths of repeated filler, asked {how}; a hit is "
        "the key's every token as the greedy choice.",
        "",
        grid_table(head, [[r["method"]] + [_passkey_cell(r, n) for n in lengths] for r in rows], 1),
    ]


def _trials_sections(payload: dict) -> list[str]:
    """Scores per task, paired comparisons and effective lengths, when the payload has its trials."""
    trials = pairs.Trials.read(payload)
    if trials is None:
        return []
    rows = {r["method"]: r for r in payload["results"]}

    alone = payload.get("tasks", {})
    baseline = set(alone.get("ladder", ())) | (
        {n for n in payload["lengths"] if n <= payload["train_len"]}
        if alone.get("baseline_within")
        else set()
    )

    def missing(method: str, n: int) -> str:
        if method != "none" and n in baseline:
            return NOT_ASKED
        return _missing(rows[method], n) if method in rows else PENDING

    L = payload["train_len"]
    gains = Gains.read(payload)
    continuous = (
        [] if gains is None else gains_section(gains, L, missing) + gain_comparisons_section(gains, L)
    )
    return (
        pairs.scores_section(trials, L, missing)
        + pairs.comparisons_section(trials, L)
        + continuous
        + pairs.effective_section(trials, L, missing)
    )


def _cost_section(payload: dict) -> list[str]:
    rows, lengths, short = payload["results"], payload["lengths"], payload["short_length"]
    none = next((r for r in rows if r["method"] == "none"), None)
    head = [
        "method",
        f"ppl, first {payload['short_tokens']} tokens @{short} (vs none)" if short else "short-prompt ppl",
        *(f"ppl, all tokens @{n}" for n in lengths),
        "seconds",
        "peak MiB",
        "note",
    ]
    body = []
    for r in rows:
        same = "; ".join(
            [f"@{n}: same schedule as {o}, measured once" for n, o in r["same_as"].items()]
            + [
                f"@{n}: not applicable, its distances would pass the trained length"
                for n in r.get("not_applicable", {})
            ]
        )
        body.append(
            [
                r["method"],
                _relative(r["ppl_short"], none and none["ppl_short"])
                if r["ppl_short"] is not None
                else _missing(r, short),
                *(_num(r["ppl_all"][str(n)], 2, _missing(r, n)) for n in lengths),
                f"{r['seconds']:.0f}",
                _num(r["peak_mib"], 0),
                same,
            ]
        )
    return ["", "## Cost inside the trained length, time and memory", "", grid_table(head, body, 2)]


def _context_section(payload: dict) -> list[str]:
    longest = str(payload["lengths"][-1])
    curves = [r for r in payload["results"] if r["ppl_by_context"].get(longest)]
    if not curves:
        return []
    buckets = curves[0]["ppl_by_context"][longest]
    head = ["method"] + [f"{a}-{b}" for a, b, _ in buckets]
    body = [[r["method"]] + [_num(p) for *_, p in r["ppl_by_context"][longest]] for r in curves]
    return ["", f"## Perplexity by context length at {longest} tokens", "", grid_table(head, body, 1)]


def summary(payload: dict) -> list[str]:
    """Facts read off the results: the best method at each length past the trained one, by perplexity and by
    passkey, and what each costs a short prompt. No verdict beyond the numbers."""
    rows, L = payload["results"], payload["train_len"]
    facts = []
    none = next((r for r in rows if r["method"] == "none"), None)
    for n in (n for n in payload["lengths"] if n > L):
        key = str(n)
        scored = [(r["ppl"][key], r["method"]) for r in rows if r["ppl"][key] is not None]
        if scored:
            best, name = min(scored)
            base = f" (as trained: {_num(none['ppl'][key])})" if none and none["ppl"][key] is not None else ""
            facts.append(
                f"At {n} tokens ({_mult(n, L)}) the lowest perplexity is {name}'s, {_num(best)}{base}."
            )
        keyed = [(r["passkey"][key], r["method"]) for r in rows if r["passkey"].get(key) is not None]
        if keyed:
            top = max(a for a, _ in keyed)
            names = ", ".join(m for a, m in keyed if a == top)
            facts.append(f"Passkey at {n} tokens: best {top:.2f} ({names}).")
    if none and none["ppl_short"] is not None:
        costs = [
            f"{r['method']} {100 * (r['ppl_short'] / none['ppl_short'] - 1):+.1f}%"
            for r in rows
            if r["method"] != "none" and r["ppl_short"] is not None
        ]
        if costs:
            facts.append(
                f"Short prompts (the first {payload['short_tokens']} tokens), perplexity against the model "
                f"as trained: {', '.join(costs)}."
            )
    trials = pairs.Trials.read(payload)
    if trials is not None:
        facts += pairs.separable_facts(trials, L)
        gains = Gains.read(payload)
        facts += gain_facts(gains, L) if gains is not None else []
    pick = suggestion(payload)
    if pick:
        facts.append(pick)
    return facts


def suggestion(payload: dict) -> str | None:
    """One method to start from, by a stated rule. With the payload's trials,
    :func:`posenc.real.pairs.suggest`: of the methods that no other beats separably at the longest length,
    the simplest. Without (an older results.json), at the longest length past the trained one, of the
    methods whose passkey accuracy lies within the best one's 95% interval (all of them without passkey),
    the lowest perplexity. None when nothing past the trained length was measured."""
    trials = pairs.Trials.read(payload)
    if trials is not None:
        return pairs.suggest(payload, trials, gains=Gains.read(payload))
    rows, L = payload["results"], payload["train_len"]
    longer = [n for n in payload["lengths"] if n > L]
    if not longer:
        return None
    key = str(longer[-1])
    measured = [r for r in rows if r["method"] != "none" and r["ppl"].get(key) is not None]
    keyed = [r for r in measured if r["passkey"].get(key) is not None]
    if keyed:
        best = max(keyed, key=lambda r: r["passkey"][key])
        floor = best["passkey_ci95"][key][0]
        measured = [r for r in keyed if r["passkey"][key] >= floor]
    if not measured:
        return None
    pick = min(measured, key=lambda r: r["ppl"][key])
    none = next((r for r in rows if r["method"] == "none"), None)
    cost = ""
    if none and none["ppl_short"] and pick["ppl_short"] is not None:
        cost = (
            f"; it costs short prompts {100 * (pick['ppl_short'] / none['ppl_short'] - 1):+.1f}% perplexity"
        )
    kept = f", passkey {pick['passkey'][key]:.2f}" if pick["passkey"].get(key) is not None else ""
    rule = (
        "of the methods whose passkey accuracy there lies within the best one's 95% interval, the lowest "
        "perplexity"
        if keyed
        else "the lowest perplexity there (no passkey was measured, so retrieval does not weigh in)"
    )
    return (
        f"Suggested start at {key} tokens: {pick['method']} (perplexity {_num(pick['ppl'][key])}{kept}{cost})"
        f". Rule: {rule}; a rule of thumb read off these numbers, with their intervals, not a verdict."
    )


def _log_axes(ax_ppl, ax_key, ax_ctx, train_len: int, lengths: list[int]) -> None:
    """Every axis log-scaled in length with the trained length dashed; the perplexities log-scaled too where
    a line was drawn (a log axis of no data cannot be drawn: it says "not measured" instead)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    drawn = {ax: any(len(line.get_xdata()) for line in ax.lines) for ax in (ax_ppl, ax_ctx)}
    for ax in (ax_ppl, ax_key, ax_ctx):
        ax.axvline(train_len, color="0.5", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plain)
        ax.grid(alpha=0.3)
    for ax in (ax_ppl, ax_key):
        ax.set_xticks(lengths)
        ax.xaxis.set_minor_formatter(NullFormatter())
    for ax in (ax_ppl, ax_ctx):
        if not drawn[ax]:  # nothing measured here, yet or at all
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)


def extend_figure(payload: dict) -> Figure:
    """Perplexity against length (the trained length marked), passkey accuracy against length (Wilson
    intervals), and perplexity by context length at the longest length; one colour per method."""
    from matplotlib.figure import Figure

    rows, L, lengths = payload["results"], payload["train_len"], payload["lengths"]
    fig = Figure(figsize=(15, 4.6), dpi=120, layout="constrained")
    ax_ppl, ax_key, ax_ctx = fig.subplots(1, 3)
    colours = {r["method"]: f"C{i % 10}" for i, r in enumerate(rows)}
    for i, r in enumerate(rows):
        c = colours[r["method"]]
        nudge = 1 + 0.015 * (i - (len(rows) - 1) / 2)  # passkey points side by side, not on top of each other
        xs = [n for n in lengths if r["ppl"][str(n)] is not None]
        ax_ppl.plot(xs, [r["ppl"][str(n)] for n in xs], "o-", color=c, label=r["method"])
        ks = [n for n in lengths if r["passkey"].get(str(n)) is not None]
        if ks:
            acc = [r["passkey"][str(n)] for n in ks]
            lo = [a - r["passkey_ci95"][str(n)][0] for a, n in zip(acc, ks, strict=True)]
            hi = [r["passkey_ci95"][str(n)][1] - a for a, n in zip(acc, ks, strict=True)]
            xs = [n * nudge for n in ks]
            ax_key.errorbar(xs, acc, yerr=[lo, hi], fmt="o-", color=c, capsize=3, label=r["method"])
        curve = r["ppl_by_context"].get(str(lengths[-1]))
        if curve:
            mids = [(a + b) / 2 for a, b, _ in curve]
            ax_ctx.plot(mids, [p for *_, p in curve], ".-", color=c, label=r["method"])
    _log_axes(ax_ppl, ax_key, ax_ctx, L, lengths)
    ax_ppl.set(
        xlabel="window length (tokens; dashed: trained length)",
        ylabel=f"perplexity of the last {payload['score_tokens']} tokens",
        title="Perplexity, the same tokens with more context",
    )
    ax_key.set(
        xlabel="prompt length (tokens)",
        ylabel="passkey accuracy",
        ylim=(-0.05, 1.05),
        title=f"Passkey retrieval ({payload['passkey']['trials']} prompts, 95% CI)",
    )
    ax_ctx.set(
        xlabel="context length of the predicted token",
        ylabel="perplexity",
        title=f"Perplexity by context length at {lengths[-1]} tokens",
    )
    if not any(r["passkey"].get(str(n)) is not None for r in rows for n in lengths):
        ax_key.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax_key.transAxes)
    ax_ppl.legend(fontsize=8)
    fig.suptitle(f"{payload['model']['name']}: trained at {L} tokens, extended by {payload['factor']:g}")
    return fig


def write(out: Path, payload: dict, *, figure: bool = True) -> tuple[str, list[str]]:
    """Write results.json, results.md and (with ``figure`` and matplotlib installed) extend.png into ``out``,
    each atomically. Returns the Markdown and the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(payload)
    write_text_atomic(out / "results.json", json.dumps(payload, indent=2))
    write_text_atomic(out / "results.md", text)
    files = [str(out / "results.json"), str(out / "results.md")]
    if figure:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return text, files
        save_figure(extend_figure(payload), out / "extend.png")
        files.append(str(out / "extend.png"))
    return text, files
