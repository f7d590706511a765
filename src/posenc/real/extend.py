"""``posenc extend``: a pretrained model, each context-extension method, perplexity and passkey retrieval at
each length.

For every method (:data:`~posenc.real.methods.EXTEND_METHODS`) and length, the model runs with the
method's RoPE (:func:`~posenc.real.methods.method_rotary`, factor = the longest length over the trained
length) or its remapped distances (:func:`~posenc.real.methods.method_remap`) over:

- ``windows`` windows that end at the same tokens at every length (:mod:`posenc.real.corpus`), scored on
  their last ``score_tokens`` tokens (the same tokens at every length), on all their tokens, on their
  first ``short_tokens`` (what a short prompt gets: the cost of a method inside the trained length), and
  per context-length bucket;
- ``passkey_trials`` passkey prompts in the model's chat template, the needle at evenly spaced depths
  (:mod:`posenc.real.passkey`).

Work is saved after every forward pass, in ``<out>/cells/<length>-<schedule>.json``: a cell holds the
results of one RoPE schedule (and remap) at one length, keyed by the model, dtype, device type and
schedule, and each result in it by a digest of the tokens it scored. A killed run loses at most one
forward pass; a rerun, or one with more windows or methods, computes only what is missing. Two methods
whose schedules coincide at a length (dynamic NTK inside the trained length is the model as trained)
share one cell.

Output: ``results.json`` (its fields: :mod:`posenc.real.report`), ``results.md``, ``extend.png``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from posenc.real.corpus import choose_windows, ids_digest, load_documents, window_ids
from posenc.real.loader import RealModel
from posenc.real.methods import (
    EXTEND_METHODS,
    applied,
    check_applicable,
    check_extendable,
    method_remap,
    method_rotary,
    trained_length,
)
from posenc.real.passkey import PasskeyPrompt, passkey_prompts, start_tokens
from posenc.real.scoring import Scorer, window_stats
from posenc.runs.files import write_text_atomic
from posenc.runs.memory import measured_peak

__all__ = [
    "ExtendResult",
    "ExtendSettings",
    "Plan",
    "check_methods",
    "check_settings",
    "resolve",
    "run_extend",
]

_CELL_VERSION = 1
SCORE_TOKENS = 1024
SHORT_TOKENS = 1024


@dataclass(frozen=True)
class ExtendSettings:
    """What ``posenc extend`` measures. None means: derived from the model (see :func:`resolve`).

    methods: keys of :data:`EXTEND_METHODS`. lengths: token counts (default: the trained length and twice
    it; on CUDA also four times). windows: windows per length. passkey_trials: prompts per length, 0 for
    none. score_tokens: the final tokens every length scores (default min(1024, shortest length / 8)).
    short_tokens: the first tokens scored as a short prompt (default min(1024, that length - 1)).
    train_len: the trained length (default from the config). factor: the extension factor (default the
    longest length / train_len, at least 1). corpus: a text file or folder (default the standard library).
    seed: the passkey keys. chat: ask the passkey in the model's chat template when it has one.
    """

    methods: tuple[str, ...] = tuple(EXTEND_METHODS)
    lengths: tuple[int, ...] | None = None
    windows: int = 4
    passkey_trials: int = 8
    score_tokens: int | None = None
    short_tokens: int | None = None
    train_len: int | None = None
    factor: float | None = None
    corpus: str | None = None
    seed: int = 0
    chat: bool = True


@dataclass(frozen=True)
class Plan:
    """Settings resolved against a model: every value concrete and checked."""

    methods: tuple[str, ...]
    lengths: tuple[int, ...]
    windows: int
    passkey_trials: int
    score_tokens: int
    short_tokens: int
    short_length: int | None  # the length whose windows give the short-prompt perplexity
    train_len: int
    factor: float


@dataclass
class ExtendResult:
    """What :func:`run_extend` wrote: the ``payload`` of results.json, the Markdown ``table``, the seconds."""

    payload: dict
    table: str
    wall_s: float
    files: list[str] = field(default_factory=list)


def _positive(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_settings(settings: ExtendSettings) -> None:
    """The checks that need no model, so that a bad flag is refused before the model loads."""
    methods = tuple(settings.methods)
    if not methods:
        raise ValueError(f"--methods is empty; choose from {', '.join(EXTEND_METHODS)}")
    unknown = [m for m in methods if m not in EXTEND_METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(EXTEND_METHODS)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--methods names a method twice: {list(methods)}")
    for n in settings.lengths or ():
        _positive("--lengths", n, minimum=16)
    if settings.lengths is not None and not settings.lengths:
        raise ValueError("--lengths is empty; give token counts like 8192,16384")
    _positive("--windows", settings.windows)
    _positive("--passkey-trials", settings.passkey_trials, minimum=0)
    for name, value in (("--train-len", settings.train_len), ("--score-tokens", settings.score_tokens)):
        if value is not None:
            _positive(name, value)
    if settings.short_tokens is not None:
        _positive("--short-tokens", settings.short_tokens)
    f = settings.factor
    if f is not None and not (isinstance(f, (int, float)) and math.isfinite(f) and f >= 1):
        raise ValueError(f"--factor must be a finite number >= 1, got {f!r}")


def resolve(settings: ExtendSettings, config, device: torch.device) -> Plan:
    """Check ``settings`` and fill in what the model decides; a ValueError naming the flag otherwise."""
    check_settings(settings)
    train_len = settings.train_len or trained_length(config)
    mults = (1, 2, 4) if device.type == "cuda" else (1, 2)
    lengths = tuple(sorted(set(settings.lengths or [train_len * m for m in mults])))
    shortest, longest = lengths[0], lengths[-1]
    score = settings.score_tokens or min(SCORE_TOKENS, shortest // 8)
    if score >= shortest:
        raise ValueError(f"--score-tokens must be below the shortest length {shortest}, got {score}")
    within = [n for n in lengths if n <= train_len]
    short_length = within[0] if within else None
    short = min(settings.short_tokens or SHORT_TOKENS, (short_length or shortest) - 1)
    factor = settings.factor if settings.factor is not None else max(1.0, longest / train_len)
    return Plan(
        methods=tuple(settings.methods),
        lengths=lengths,
        windows=settings.windows,
        passkey_trials=settings.passkey_trials,
        score_tokens=score,
        short_tokens=short,
        short_length=short_length,
        train_len=train_len,
        factor=float(factor),
    )


def check_methods(plan: Plan, config) -> tuple[dict, dict, dict]:
    """Each method's RoPE and remap for the model of ``config``, and (method, length) -> why it cannot run
    there; a ValueError naming the method before any work when one cannot run on this model at all, or
    when no chosen method applies at any length (nothing would be measured)."""
    rotaries = {
        m: method_rotary(config, m, factor=plan.factor, train_len=plan.train_len) for m in plan.methods
    }
    remaps = {m: method_remap(m, train_len=plan.train_len, longest=plan.lengths[-1]) for m in plan.methods}
    refused: dict[tuple[str, int], str] = {}
    for m in plan.methods:
        check_applicable(config, m, remaps[m])
        for n in plan.lengths:
            if remaps[m] is not None:
                try:
                    remaps[m].check_length(n, plan.train_len)
                except ValueError as e:
                    refused[m, n] = str(e)
    if len(refused) == len(plan.methods) * len(plan.lengths):
        (m, n), why = next(iter(refused.items()))
        raise ValueError(
            f"nothing to measure: none of --methods {','.join(plan.methods)} applies at --lengths "
            f"{','.join(map(str, plan.lengths))} (trained length {plan.train_len}); {m} at {n}: {why}"
        )
    return rotaries, remaps, refused


# ---------------------------------------------------------------------------------------------- cells


def _schedule_digest(rotary, remap, length: int) -> str:
    """What decides a RoPE forward at ``length``: the frequencies, attention factor, dimensions, layout, and
    the remap of a training-free method."""
    inv_freq, attention = rotary.frequencies(length)
    h = hashlib.sha256(inv_freq.to(torch.float64).numpy().tobytes())
    h.update(repr((float(attention), rotary.rotary_dim, rotary.head_dim, rotary.layout)).encode())
    if remap is not None:
        h.update(repr(remap).encode())
    return h.hexdigest()[:16]


def _model_digest(info: dict) -> str:
    folder = Path(info["folder"])
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]


class Cell:
    """The saved results of one schedule at one length: ``items`` by key, written after each addition."""

    def __init__(self, path: Path, key: dict, first: str):
        self.path, self.key = path, key
        self.first = first  # the first method (in the run's order) whose schedule this is
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


# ---------------------------------------------------------------------------------------------- work


@dataclass(frozen=True)
class _Job:
    """One forward pass: a window to score or a passkey prompt to answer."""

    item: str
    ids: list[int]
    what: str
    prompt: PasskeyPrompt | None = None


def _jobs(plan: Plan, length: int, windows: list, docs: list, start: list[int], prompts) -> list[_Job]:
    jobs = []
    for i, w in enumerate(windows):
        ids = window_ids(docs[w.document], w, length, start)
        item = f"window/{ids_digest(ids)}/{plan.score_tokens}/{plan.short_tokens}"
        jobs.append(_Job(item, ids, f"window {i + 1}/{len(windows)}"))
    for i, p in enumerate(prompts.get(length, [])):
        jobs.append(
            _Job(
                f"passkey/{ids_digest(p.ids)}/{p.answer_len}",
                list(p.ids),
                f"passkey {i + 1}/{len(prompts[length])}",
                p,
            )
        )
    return jobs


def _run_job(scorer: Scorer, job: _Job, plan: Plan, device: torch.device, tokenizer) -> dict:
    t0 = time.perf_counter()
    with measured_peak(device) as peak:
        if job.prompt is None:
            result = window_stats(scorer.nll(job.ids), plan.score_tokens, plan.short_tokens)
        else:
            p = job.prompt
            picked = scorer.answers(job.ids, p.answer_len)
            result = {
                "hit": picked == list(p.ids[-p.answer_len :]),
                "depth": p.depth,
                "key": p.key,
                "answer": tokenizer.decode(picked).strip(),
            }
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    result["peak_mib"] = round(peak() / 2**20, 1)
    return result


def run_extend(
    real: RealModel, settings: ExtendSettings, out: str | Path, *, progress: bool = True, figure: bool = True
) -> ExtendResult:
    """Measure every method of ``settings`` on ``real`` into ``out`` (see the module docstring); ``progress``
    shows a bar over the tokens to run, ``figure`` draws extend.png at the end."""
    from posenc.real import report

    t_start = time.perf_counter()
    out = Path(out)
    model, tokenizer = real.model, real.tokenizer
    device = next(model.parameters()).device
    check_extendable(model.config)
    plan = resolve(settings, model.config, device)
    rotaries, remaps, refused = check_methods(plan, model.config)  # before the corpus is tokenized
    start = start_tokens(tokenizer)
    need = plan.lengths[-1] - len(start)
    docs = load_documents(settings.corpus, tokenizer, need, enough=plan.windows)
    windows = choose_windows(docs, plan.windows, need, plan.score_tokens)
    prompts = {
        n: passkey_prompts(tokenizer, n, plan.passkey_trials, seed=settings.seed, chat=settings.chat)
        for n in plan.lengths
        if plan.passkey_trials
    }
    chat = bool(settings.chat and getattr(tokenizer, "chat_template", None))
    jobs = {n: _jobs(plan, n, windows, docs, start, prompts) for n in plan.lengths}
    cells = _cells(out, real.info, model, rotaries, remaps, plan, refused)

    todo, seen = [], set()  # (method, length, jobs to run): each cell once, in the order of the methods
    for m in plan.methods:
        for n in plan.lengths:
            cell = cells[m, n]
            if cell is not None and id(cell) not in seen:
                seen.add(id(cell))
                missing = [j for j in jobs[n] if j.item not in cell.items]
                if missing:
                    todo.append((m, n, missing))
    bar = _progress(sum(len(j.ids) for *_, run in todo for j in run), progress)
    scorer = Scorer(model) if todo else None

    def write(final: bool) -> tuple[dict, str, list[str]]:
        rows = [_row(m, plan, jobs, cells, rotaries[m], remaps[m], refused) for m in plan.methods]
        payload = _payload(real.info, plan, settings, windows, docs, rows, chat)
        return (payload, *report.write(out, payload, figure=final))

    try:
        for m, n, run in todo:
            with applied(model, rotaries[m], remaps[m]):
                for job in run:
                    if bar is not None:
                        bar.set_postfix_str(f"{m} @ {n}: {job.what}")
                    cells[m, n].add(job.item, _run_job(scorer, job, plan, device, tokenizer))
                    if bar is not None:
                        bar.update(len(job.ids))
            write(final=False)  # the finished cells are readable while the rest runs
    finally:
        if bar is not None:
            bar.close()
    payload, table, files = write(final=figure)
    return ExtendResult(payload, table, time.perf_counter() - t_start, files)


def _cells(out: Path, info: dict, model, rotaries: dict, remaps: dict, plan: Plan, refused: dict):
    """(method, length) -> its cell. Methods whose schedules coincide at a length share one cell; where a
    remap cannot keep a length's distances inside the trained length (``refused``) the method gets none."""
    param = next(model.parameters())
    base = {"version": _CELL_VERSION, "model": _model_digest(info), "dtype": str(param.dtype)}
    base["device"] = param.device.type
    made: dict[tuple[str, int], Cell] = {}
    cells: dict[tuple[str, int], Cell | None] = {}
    for m in plan.methods:
        for n in plan.lengths:
            if (m, n) in refused:
                cells[m, n] = None
                continue
            digest = _schedule_digest(rotaries[m], remaps[m], n)
            if (digest, n) not in made:
                key = {**base, "schedule": digest, "length": n}
                made[digest, n] = Cell(out / "cells" / f"{n}-{digest}.json", key, m)
            cells[m, n] = made[digest, n]
    return cells


def _progress(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="extend", unit="tok", unit_scale=True, dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------- results


def _ppl(parts: list[list]) -> float | None:
    total, n = math.fsum(p[0] for p in parts), sum(p[1] for p in parts)
    return math.exp(total / n) if n else None


def _row(method: str, plan: Plan, jobs: dict, cells: dict, rotary, remap, refused: dict) -> dict:
    """One method's results: every measure keyed by the length as a string, None where not measured (yet,
    or at all: ``not_applicable`` says why)."""
    row = {
        "method": method,
        "description": EXTEND_METHODS[method],
        "scaling": rotary.scaling,
        "remap": None if remap is None else repr(remap),
        "ppl": {},
        "ppl_all": {},
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
            for name in ("ppl", "ppl_all", "ppl_by_context", "passkey"):
                row[name][key] = None
            continue
        if cell.first != method:
            row["same_as"][key] = cell.first
        done = [cell.items.get(j.item) for j in jobs[n]]
        wins = [r for j, r in zip(jobs[n], done, strict=True) if j.prompt is None]
        keys = [r for j, r in zip(jobs[n], done, strict=True) if j.prompt is not None]
        _fill_perplexity(row, key, wins, short=n == plan.short_length)
        _fill_passkey(row, key, keys)
        present = [r for r in done if r is not None]
        row["seconds_by_length"][key] = round(math.fsum(r["seconds"] for r in present), 1)
        peaks = [r["peak_mib"] for r in present]
        if peaks:
            row["peak_mib"] = max(row["peak_mib"] or 0.0, *peaks)
    row["seconds"] = round(math.fsum(row["seconds_by_length"].values()), 1)
    return row


def _fill_perplexity(row: dict, key: str, wins: list, *, short: bool) -> None:
    """A length's perplexities (of the final tokens, of every token, of the first tokens at the trained
    length, by context bucket) from its windows' saved results; None until every window is done."""
    whole = all(r is not None for r in wins)
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
    from posenc.lab.stats import wilson_interval

    if not keys or any(r is None for r in keys):
        row["passkey"][key] = None
        return
    hits = sum(r["hit"] for r in keys)
    row["passkey"][key] = hits / len(keys)
    row["passkey_hits"][key] = hits
    row["passkey_ci95"][key] = list(wilson_interval(hits, len(keys)))
    row["passkey_trials"][key] = [{k: r[k] for k in ("depth", "key", "hit", "answer")} for r in keys]


def _payload(
    info: dict, plan: Plan, settings: ExtendSettings, windows, docs, rows: list[dict], chat: bool
) -> dict:
    from posenc.real.passkey import KEY_DIGITS
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
        "corpus": {
            "path": settings.corpus,
            "windows": [{"document": docs[w.document].name, "end": w.end} for w in windows],
        },
        "passkey": {
            "trials": plan.passkey_trials,
            "digits": KEY_DIGITS,
            "seed": settings.seed,
            "chat_template": chat,
        },
        "results": rows,
        "provenance": {**environment(info["device"]), **versions, "settings": asdict(settings)},
    }
