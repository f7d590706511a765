"""What ``posenc extend`` reports, read from its cells: one row per method, the trials, the payload.

Each measure is keyed by the length as a string and None where it was not measured (yet: a running or
killed run reports what is done; or at all: ``not_applicable`` says why). The payload's fields are listed
in :mod:`posenc.real.report`.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from importlib import metadata

from posenc.real.layers import parse_method
from posenc.real.methods import EXTEND_METHODS
from posenc.runs.statistics import wilson_interval

__all__ = ["method_row", "payload", "trial_scores"]


def _ppl(parts: list[list]) -> float | None:
    total, n = math.fsum(p[0] for p in parts), sum(p[1] for p in parts)
    return math.exp(total / n) if n else None


def _description(spec: str) -> str:
    return "; ".join(
        EXTEND_METHODS[p.method] + (f" (layers {p.layers.replace(',', '/')})" if p.layers else "")
        for p in parse_method(spec)
    )


def method_row(method: str, plan, jobs: dict, cells: dict, treatment, refused: dict, keys=None) -> dict:
    """One method's results (module docstring); ``plan``: the resolved settings, ``jobs``: length -> the
    jobs every method runs there, ``cells``: (method, length) -> its cell, ``keys``: each window's LongPPL key
    tokens among its scored tail (:mod:`posenc.real.longppl`; None: not measured)."""
    row = {
        "method": method,
        "description": _description(method),
        "scaling": treatment.scaling,
        "remap": None if treatment.remap is None else repr(treatment.remap),
        "plan": treatment.lines(),
        "ppl": {},
        "ppl_all": {},
        "longppl": {},
        "longppl_keys": None if keys is None else sum(map(len, keys)),
        "ppl_short": None,
        "passkey": {},
        "passkey_hits": {},
        "passkey_ci95": {},
        "passkey_trials": {},
        "ppl_by_context": {},
        "same_as": {},
        "not_applicable": {},
        "seconds": 0.0,
        "seconds_by_length": {},
        "peak_mib": None,
    }
    for n in plan.lengths:
        cell, key = cells[method, n], str(n)
        if cell is None:
            row["not_applicable"][key] = refused[method, n]
            for name in ("ppl", "ppl_all", "ppl_by_context", "passkey", "longppl"):
                row[name][key] = None
            continue
        if cell.first != method:
            row["same_as"][key] = cell.first
        done = [(j, cell.items.get(j.item)) for j in jobs[n]]
        wins = [r for j, r in done if j.kind == "window"]
        _fill_perplexity(row, key, wins, short=n == plan.short_length)
        row["longppl"][key] = _longppl(wins, keys)
        _fill_passkey(row, key, [r for j, r in done if j.kind == "passkey"])
        present = [r for _, r in done if r is not None]
        row["seconds_by_length"][key] = round(math.fsum(r["seconds"] for r in present), 1)
        peaks = [r["peak_mib"] for r in present]
        if peaks:
            row["peak_mib"] = max(row["peak_mib"] or 0.0, *peaks)
    row["seconds"] = round(math.fsum(row["seconds_by_length"].values()), 1)
    return row


def _longppl(wins: list, keys) -> float | None:
    """LongPPL at one length: the perplexity of every window's key tokens; None until all are measured."""
    if keys is None or not wins or any(r is None or "tail_nll" not in r for r in wins):
        return None
    losses = [r["tail_nll"][i] for r, k in zip(wins, keys, strict=True) for i in k]
    return math.exp(math.fsum(losses) / len(losses)) if losses else None


def _fill_perplexity(row: dict, key: str, wins: list, *, short: bool) -> None:
    """A length's perplexities (of the final tokens, of every token, of the first tokens at the trained
    length, by context bucket) from its windows' saved results; None until every window is done."""
    whole = bool(wins) and all(r is not None for r in wins)
    row["ppl"][key] = _ppl([r["tail"] for r in wins]) if whole else None
    row["ppl_all"][key] = _ppl([r["all"] for r in wins]) if whole else None
    if whole and short:
        row["ppl_short"] = _ppl([r["head"] for r in wins])
    row["ppl_by_context"][key] = (
        [[b[0], b[1], _ppl([r["buckets"][i][2:] for r in wins])] for i, b in enumerate(wins[0]["buckets"])]
        if whole
        else None
    )


def _fill_passkey(row: dict, key: str, keys: list) -> None:
    """A length's passkey accuracy, hits, 95% Wilson interval and trials; None until every prompt is done."""
    if not keys or any(r is None for r in keys):
        row["passkey"][key] = None
        return
    hits = sum(r["hit"] for r in keys)
    row["passkey"][key] = hits / len(keys)
    row["passkey_hits"][key] = hits
    row["passkey_ci95"][key] = list(wilson_interval(hits, len(keys)))
    row["passkey_trials"][key] = [{k: r[k] for k in ("depth", "key", "hit", "answer")} for r in keys]


def trial_scores(methods, lengths, jobs: dict, cells: dict) -> list[dict]:
    """Every answered question of the task suite, one entry per method, length and question: ``{"method",
    "length", "task", "trial", "depth", "score", "hit", "answer", "haystack", "logprob", "control_logprob",
    "gain", "gold_tokens"}``; ``"trial"`` names the question the same for every method, so that methods pair
    on it (:mod:`posenc.real.pairs`), ``"haystack"`` the trial it was asked in (the cluster its intervals
    resample)."""
    out = []
    for m in methods:
        for n in lengths:
            cell = cells[m, n]
            for job in jobs[n] if cell is not None else ():
                result = cell.items.get(job.item) if job.kind == "trial" else None
                for q in result["questions"] if result else ():
                    out.append(
                        {
                            "method": m,
                            "length": n,
                            "task": result["task"],
                            "trial": q["id"],
                            "depth": q["depth"],
                            "score": q["score"],
                            "hit": q["score"] == 1.0,
                            "answer": q["answer"],
                            # the continuous scores (posenc.real.trials); None in cells saved before them
                            "haystack": f"{result['task']}/{n}/{result['index']}",
                            "logprob": q.get("logprob"),
                            "control_logprob": q.get("control_logprob"),
                            "gain": q.get("gain"),
                            "gold_tokens": q.get("gold_tokens"),
                        }
                    )
    return out


def trial_costs(lengths, jobs: dict, cells: dict, methods) -> dict:
    """Per length: trials run, questions answered, and the mean seconds of a trial's own prefill (from its
    needle on), of its share of the needle-free haystack's forward, of its control's scoring, of the whole
    trial and of a question, over every method's cells (a shared cell counted once)."""
    costs, seen = {}, set()
    for n in lengths:
        results = []
        for m in methods:
            cell = cells[m, n]
            if cell is None or id(cell) in seen:
                continue
            seen.add(id(cell))
            results += [cell.items[j.item] for j in jobs[n] if j.kind == "trial" and j.item in cell.items]
        if not results:
            continue
        questions = [q for r in results for q in r["questions"]]
        costs[str(n)] = {
            "forwards": len(results),
            "questions": len(questions),
            "prefill_s": round(math.fsum(r["prefill_s"] for r in results) / len(results), 2),
            # a trial's share of its task's needle-free haystack, and its control's scoring (0 before them)
            "shared_s": round(math.fsum(r.get("shared_s", 0.0) for r in results) / len(results), 2),
            "control_s": round(math.fsum(r.get("control_s", 0.0) for r in results) / len(results), 2),
            "trial_s": round(math.fsum(r["seconds"] for r in results) / len(results), 2),
            "question_s": round(math.fsum(q["seconds"] for q in questions) / max(1, len(questions)), 2),
        }
    return costs


def payload(info: dict, plan, settings, corpus: dict, rows: list[dict], extra: dict) -> dict:
    """results.json: the model, the resolved settings, every row, ``extra`` (the passkey's settings, the
    tasks, trials and their costs) and where it ran."""
    from posenc.runs.provenance import environment

    versions = {}
    for name in ("transformers", "tokenizers", "gguf", "accelerate"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "model": info,
        "train_len": plan.train_len,
        "factor": plan.factor,
        "lengths": list(plan.lengths),
        "score_tokens": plan.score_tokens,
        "short_tokens": plan.short_tokens,
        "short_length": plan.short_length,
        "corpus": corpus,
        **extra,
        "results": rows,
        "provenance": {**environment(info["device"]), **versions, "settings": asdict(settings)},
    }
