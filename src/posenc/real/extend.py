"""``posenc extend``: a pretrained model, each context-extension method, perplexity and long-context tasks at
each length.

For every method (a ``--methods`` entry: :mod:`posenc.real.layers`) and length, the model runs as the
method's :class:`~posenc.real.methods.Treatment` says (its RoPE, its remapped distances, or its per-layer
plan; factor = the longest length over the trained length) over:

- ``windows`` windows that end at the same tokens at every length (:mod:`posenc.real.corpus`), scored on
  their last ``score_tokens`` tokens (the same tokens at every length), on all their tokens, on their
  first ``short_tokens`` (what a short prompt gets: the cost of a method inside the trained length), and
  per context-length bucket;
- the task suite (:mod:`posenc.real.tasks`, RULER's tasks): ``trials`` haystacks per task and length,
  each run once and answered by its questions from that one forward (:mod:`posenc.real.trials`); every
  method sees the same trials, so they pair (:mod:`posenc.real.pairs`);
- ``passkey_trials`` teacher-forced passkey prompts (:mod:`posenc.real.passkey`), one forward each (the
  task suite's ``passkey`` task asks the same thing and shares its forwards).

A ``--budget`` (:mod:`posenc.real.budgets`) sizes what no flag gives. Work is saved after every forward
pass in cells (:mod:`posenc.real.cells`): a killed run loses at most one forward pass, and a rerun computes
only what is missing.

Output: ``results.json`` (its fields: :mod:`posenc.real.report`), ``results.md``, ``extend.png``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from posenc.real.budgets import check_budget, default_budget
from posenc.real.cells import cells_for
from posenc.real.continuation import Continuation
from posenc.real.corpus import choose_windows, ids_digest, load_documents, window_ids
from posenc.real.layers import DEFAULT_LAYERS
from posenc.real.loader import RealModel
from posenc.real.longppl import short_context_ids, truncation, window_keys
from posenc.real.methods import (
    EXTEND_METHODS,
    check_applicable,
    check_extendable,
    trained_length,
    treatment,
)
from posenc.real.passkey import PasskeyPrompt, passkey_prompts, start_tokens
from posenc.real.results import method_row, payload, trial_costs, trial_scores
from posenc.real.scoring import Scorer, window_stats
from posenc.real.settings import NO_TASKS, ExtendSettings, check_settings
from posenc.real.tasks import DEFAULT_TASKS, TASKS, make_trials, min_length
from posenc.real.tasks.answers import budgeted
from posenc.real.trials import common_prefix, run_trials, shared_base, trial_item
from posenc.runs.memory import measured_peak

__all__ = [
    "ExtendResult",
    "ExtendSettings",
    "Resolved",
    "check_methods",
    "check_settings",
    "resolve",
    "run_extend",
]

SCORE_TOKENS = 1024
SHORT_TOKENS = 1024


@dataclass(frozen=True)
class Resolved:
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
    budget: str = "default"
    tasks: tuple[str, ...] = ()
    trials: int = 1
    questions: int | None = None
    layers: str = DEFAULT_LAYERS
    answer_tokens: int | None = None
    answer_slack: int | None = None
    ladder: tuple[int, ...] = ()  # lengths where only the model as trained runs, on the tasks alone
    baseline_within: bool = False  # up to the trained length, only the model as trained answers the tasks


@dataclass
class ExtendResult:
    """What :func:`run_extend` wrote: the ``payload`` of results.json, the Markdown ``table``, the seconds."""

    payload: dict
    table: str
    wall_s: float
    files: list[str] = field(default_factory=list)


def _planned(config) -> bool:
    from posenc.hf.layers import ADAPTERS
    from posenc.hf.plan import text_config

    return (_config_get(text_config(config), "model_type") or "") in ADAPTERS


def resolve(settings: ExtendSettings, config, device: torch.device) -> Resolved:
    """Check ``settings`` and fill in what the budget and the model decide; a ValueError naming the flag
    otherwise."""
    check_settings(settings)
    budget = check_budget(settings.budget) or default_budget(device.type == "cuda")
    train_len = settings.train_len or budget.train_len or trained_length(config)
    lengths = tuple(sorted(set(settings.lengths or [train_len * m for m in budget.mults])))
    shortest, longest = lengths[0], lengths[-1]
    if settings.questions is not None and settings.questions > shortest:
        # each question takes tokens of the haystack: refused before a trial's text is built for them all
        raise ValueError(
            f"--questions {settings.questions}: a haystack of {shortest} tokens (the shortest length) cannot "
            f"hold that many questions; give at most {shortest}, or longer --lengths"
        )
    score = settings.score_tokens or min(SCORE_TOKENS, shortest // 8)
    if score >= shortest:
        raise ValueError(f"--score-tokens must be below the shortest length {shortest}, got {score}")
    within = [n for n in lengths if n <= train_len]
    short_length = within[0] if within else None
    short = min(settings.short_tokens or SHORT_TOKENS, (short_length or shortest) - 1)
    factor = settings.factor if settings.factor is not None else max(1.0, longest / train_len)
    planned = _planned(config)
    default_methods = (budget.planned if planned else budget.methods) or _applicable(config, planned)
    tasks = (budget.tasks or DEFAULT_TASKS) if settings.tasks is None else tuple(settings.tasks)
    methods = tuple(settings.methods or default_methods)
    if settings.ladder is None:
        ladder = {round(f * train_len) for f in budget.ladder}
    else:
        ladder = set(settings.ladder)
    ladder = (
        tuple(sorted(n for n in ladder if n < shortest)) if "none" in methods and tasks != NO_TASKS else ()
    )
    return Resolved(
        methods=methods,
        lengths=lengths,
        windows=settings.windows or budget.windows,
        passkey_trials=settings.passkey_trials,
        score_tokens=score,
        short_tokens=short,
        short_length=short_length,
        train_len=train_len,
        factor=float(factor),
        budget=budget.name,
        tasks=() if tasks == NO_TASKS else tasks,
        trials=settings.trials or budget.trials,
        questions=settings.questions or budget.questions,
        layers=settings.layers,
        answer_tokens=settings.answer_tokens or budget.answer_tokens,
        # an absolute cap given on the command line replaces the budget's slack
        answer_slack=None if settings.answer_tokens else budget.answer_slack,
        ladder=ladder,
        baseline_within=budget.baseline_within,
    )


def _applicable(config, planned: bool) -> tuple[str, ...]:
    """Every method that applies to the model of ``config``: a plan takes no remap, and a layer conversion
    (NoPE on the global layers) applies to a model with sliding-window layers (on a model whose every layer
    is global it would take all of its positions away: asked for by name, it runs)."""
    from posenc.extension import METHODS
    from posenc.hf.plan import text_config

    sliding = "sliding_attention" in (_config_get(text_config(config), "layer_types") or ())

    def applies(m: str) -> bool:
        kind = "none" if m == "none" else METHODS[m].kind
        return not (planned and kind == "remap") and not (kind == "layers" and not sliding)

    return tuple(m for m in EXTEND_METHODS if applies(m))


def _config_get(config, name: str):
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def check_methods(plan: Resolved, config) -> tuple[dict, dict]:
    """Each method's :class:`~posenc.real.methods.Treatment` for the model of ``config``, and (method, length)
    -> why it cannot run there; a ValueError naming the method before any work when one cannot run on this
    model at all, or when no chosen method applies at any length (nothing would be measured)."""
    treatments = {
        m: treatment(
            config,
            m,
            factor=plan.factor,
            train_len=plan.train_len,
            longest=plan.lengths[-1],
            layers=plan.layers,
        )
        for m in plan.methods
    }
    refused: dict[tuple[str, int], str] = {}
    for m, t in treatments.items():
        check_applicable(config, m, t.remap)
        for n in plan.lengths:
            if t.remap is not None:
                try:
                    t.remap.check_length(n, plan.train_len)
                except ValueError as e:
                    refused[m, n] = str(e)
    if len(refused) == len(plan.methods) * len(plan.lengths):
        (m, n), why = next(iter(refused.items()))
        raise ValueError(
            f"nothing to measure: none of --methods {','.join(plan.methods)} applies at --lengths "
            f"{','.join(map(str, plan.lengths))} (trained length {plan.train_len}); {m} at {n}: {why}"
        )
    return treatments, refused


def fitting_tasks(plan: Resolved, tokenizer, chat: bool, *, asked: bool) -> tuple[tuple[str, ...], dict]:
    """The tasks of ``plan`` that fill its shortest length with this tokenizer, and task -> why not for the
    others. A task the user named (``asked``) that cannot fill it is a ValueError, before any forward pass;
    the default tasks leave it out (the report says so)."""
    kept, left = [], {}
    for task in plan.tasks:
        least = min_length(task, tokenizer, chat=chat, questions=_questions(task, plan.questions))
        if plan.lengths[0] >= least:
            kept.append(task)
            continue
        if asked:
            raise ValueError(
                f"--tasks {task} needs at least {least} tokens with this tokenizer, and --lengths starts at "
                f"{plan.lengths[0]}; use longer lengths or leave {task} out of --tasks"
            )
        left[task] = f"needs at least {least} tokens; the shortest length is {plan.lengths[0]}"
    return tuple(kept), left


def _fitting_ladder(plan: Resolved, tasks, tokenizer, chat: bool) -> tuple[int, ...]:
    """The ladder's lengths that every task of ``tasks`` fills (a shorter one is left out)."""
    least = max(
        (min_length(t, tokenizer, chat=chat, questions=_questions(t, plan.questions)) for t in tasks),
        default=0,
    )
    return tuple(n for n in plan.ladder if n >= least) if tasks else ()


def _questions(task: str, asked: int | None) -> int | None:
    """Questions per haystack of ``task``: ``asked`` (None: the task's own), at most what the task takes (a
    task with one answer per haystack, such as cwe, asks once)."""
    most = TASKS[task].max_questions
    return asked if asked is None or most is None else min(asked, most)


# ---------------------------------------------------------------------------------------------- work


@dataclass(frozen=True)
class _Job:
    """One long forward pass: a window to score, a passkey prompt to answer, or a trial whose questions
    continue it. ``tokens``: what it reads, for the progress bar."""

    item: str
    kind: str
    tokens: int
    what: str
    ids: tuple[int, ...] = ()
    prompt: PasskeyPrompt | None = None
    trial: object = None


def _jobs(
    plan: Resolved, length: int, windows: list, docs: list, start: list[int], prompts, trials
) -> list[_Job]:
    jobs = []
    for i, w in enumerate(windows):
        ids = window_ids(docs[w.document], w, length, start)
        item = f"window/{ids_digest(ids)}/{plan.score_tokens}/{plan.short_tokens}"
        jobs.append(_Job(item, "window", len(ids), f"window {i + 1}/{len(windows)}", tuple(ids)))
    if length == plan.train_len:  # LongPPL's key tokens: the model as trained, against a truncated context
        trunc = truncation(plan.train_len)
        for i, w in enumerate(windows):
            ids = short_context_ids(window_ids(docs[w.document], w, length, start), plan.score_tokens, trunc)
            item = f"short/{ids_digest(ids)}/{plan.score_tokens}"
            jobs.append(_Job(item, "short", len(ids), f"short context {i + 1}/{len(windows)}", tuple(ids)))
    for i, p in enumerate(prompts.get(length, [])):
        item = f"passkey/{ids_digest(p.ids)}/{p.answer_len}"
        jobs.append(_Job(item, "passkey", len(p.ids), f"passkey {i + 1}/{len(prompts[length])}", p.ids, p))
    cost = _trial_tokens(trials.get(length, []))
    for t in trials.get(length, []):
        what = f"{t.task} {t.index + 1}/{plan.trials}"
        jobs.append(_Job(trial_item(t), "trial", cost[id(t)], what, trial=t))
    return jobs


def _trial_tokens(trials: list) -> dict[int, int]:
    """id(trial) -> the tokens its forwards read, for the progress bar: its own from its needle on, and its
    share of its task's needle-free haystack (:mod:`posenc.real.trials`; a model that cannot share reads
    more)."""
    out = {}
    for task in dict.fromkeys(t.task for t in trials):
        mine = [t for t in trials if t.task == task]
        base = shared_base(mine)
        for t in mine:
            out[id(t)] = len(t.prefix) - common_prefix(t.prefix, base) + len(base) // len(mine)
    return out


def _groups(run: list[_Job]) -> list[list[_Job]]:
    """``run`` as its units of work: the trials of one task together (they share their haystack's
    forward, :mod:`posenc.real.trials`), every other job alone."""
    groups: list[list[_Job]] = []
    for job in run:
        same = groups and job.kind == "trial" and groups[-1][0].kind == "trial"
        if same and groups[-1][0].trial.task == job.trial.task:
            groups[-1].append(job)
        else:
            groups.append([job])
    return groups


def _run_job(scorer: Scorer, runner: Continuation, job: _Job, plan: Resolved, device, tokenizer) -> dict:
    t0 = time.perf_counter()
    with measured_peak(device) as peak:
        if job.kind == "window":
            result = window_stats(scorer.nll(list(job.ids)), plan.score_tokens, plan.short_tokens)
        elif job.kind == "short":
            result = {
                "short_nll": [round(v, 6) for v in scorer.nll(list(job.ids))[-plan.score_tokens :].tolist()]
            }
        else:
            p = job.prompt
            picked = scorer.answers(list(p.ids), p.answer_len)
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


def _inputs(plan: Resolved, settings: ExtendSettings, tokenizer):
    """The windows (and their documents), passkey prompts and trials every method runs at each length."""
    start = start_tokens(tokenizer)
    need = plan.lengths[-1] - len(start)
    docs = load_documents(settings.corpus, tokenizer, need, enough=plan.windows)
    windows = choose_windows(docs, plan.windows, need, plan.score_tokens)
    prompts = {
        n: passkey_prompts(tokenizer, n, plan.passkey_trials, seed=settings.seed, chat=settings.chat)
        for n in plan.lengths
        if plan.passkey_trials
    }
    trials = {
        n: [
            budgeted(t, tokenizer, plan.answer_tokens, plan.answer_slack)
            for task in plan.tasks
            for t in make_trials(
                task,
                tokenizer,
                n,
                plan.trials,
                seed=settings.seed,
                chat=settings.chat,
                questions=_questions(task, plan.questions),
            )
        ]
        for n in (*plan.ladder, *plan.lengths)
    }
    return docs, windows, start, prompts, trials


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
    treatments, refused = check_methods(plan, model.config)  # before the corpus is tokenized
    tasks, left_out = fitting_tasks(plan, tokenizer, settings.chat, asked=settings.tasks is not None)
    plan = replace(plan, tasks=tasks, ladder=_fitting_ladder(plan, tasks, tokenizer, settings.chat))
    if progress and left_out:
        print(f"left out: {'; '.join(f'{t} {why}' for t, why in left_out.items())}", file=sys.stderr)
    if progress:
        _print_plans(treatments)
    docs, windows, start, prompts, trials = _inputs(plan, settings, tokenizer)
    jobs, cells = _work(plan, out, real, treatments, refused, (docs, windows, start, prompts, trials))
    every_length = (*plan.ladder, *plan.lengths)
    todo = _todo(plan, cells, jobs)
    bar = _progress(sum(j.tokens for *_, run in todo for j in run), progress)
    tools = _Tools(Scorer(model) if todo else None, Continuation(model, tokenizer), plan, device, tokenizer)
    extra = _extra(plan, settings, tokenizer, left_out)
    corpus = {
        "path": settings.corpus,
        "windows": [{"document": docs[w.document].name, "end": w.end} for w in windows],
    }

    def write(final: bool) -> tuple[dict, str, list[str]]:
        keys = _key_tokens(plan, cells, jobs)
        rows = [method_row(m, plan, jobs, cells, treatments[m], refused, keys) for m in plan.methods]
        scored = {
            "trials": trial_scores(plan.methods, every_length, jobs, cells),
            "trial_costs": trial_costs(every_length, jobs, cells, plan.methods),
        }
        data = payload(real.info, plan, settings, corpus, rows, {**extra, **scored})
        return (data, *report.write(out, data, figure=final))

    try:
        for m, n, run in todo:
            with treatments[m].applied(model):
                _run_cell(tools, f"{m} @ {n}", run, cells[m, n], bar)
            write(final=False)  # the finished cells are readable while the rest runs
    finally:
        if bar is not None:
            bar.close()
    data, table, files = write(final=figure)
    return ExtendResult(data, table, time.perf_counter() - t_start, files)


def _work(
    plan: Resolved, out: Path, real: RealModel, treatments: dict, refused: dict, inputs
) -> tuple[dict, dict]:
    """Every length's jobs and every (method, length)'s cell (:mod:`posenc.real.cells`): at the ladder's
    lengths the tasks alone, in the model as trained's cells alone."""
    docs, windows, start, prompts, trials = inputs
    jobs = {n: _jobs(plan, n, windows, docs, start, prompts, trials) for n in plan.lengths}
    jobs.update({n: _jobs(plan, n, [], docs, start, {}, trials) for n in plan.ladder})
    cells = cells_for(out, real.info, real.model, treatments, plan.lengths, refused)
    if plan.ladder:
        cells.update(cells_for(out, real.info, real.model, {"none": treatments["none"]}, plan.ladder, {}))
        cells.update({(m, n): None for m in plan.methods if m != "none" for n in plan.ladder})
    return jobs, cells


@dataclass(frozen=True)
class _Tools:
    """What runs a job: the scorer of windows and passkeys, the runner of trials, and their settings."""

    scorer: Scorer | None
    runner: Continuation
    plan: Resolved
    device: torch.device
    tokenizer: object


def _run_cell(tools: _Tools, where: str, run: list[_Job], cell, bar) -> None:
    """The jobs ``run`` into ``cell``, each saved as it is done; the trials of a task together, sharing
    their haystack's forward (:func:`posenc.real.trials.run_trials`)."""

    def done(job: _Job) -> None:
        if bar is not None:
            bar.update(job.tokens)

    for group in _groups(run):
        if bar is not None:
            bar.set_postfix_str(f"{where}: {group[0].what}")
        if group[0].kind == "trial":
            jobs_of = {id(j.trial): j for j in group}

            def save(trial, result: dict, jobs_of=jobs_of) -> None:
                cell.add(jobs_of[id(trial)].item, result)
                done(jobs_of[id(trial)])

            run_trials(tools.runner, [j.trial for j in group], tools.device, save)
            continue
        (job,) = group
        cell.add(
            job.item, _run_job(tools.scorer, tools.runner, job, tools.plan, tools.device, tools.tokenizer)
        )
        done(job)


def _key_tokens(plan: Resolved, cells: dict, jobs: dict) -> list[list[int]] | None:
    """LongPPL's key tokens of each window (:func:`posenc.real.longppl.window_keys`), from the model as
    trained at the trained length; None while they are not measured (or the trained length is not run)."""
    cell = cells.get(("none", plan.train_len))
    if cell is None or plan.train_len not in jobs:
        return None
    found = {
        kind: [cell.items.get(j.item) for j in jobs[plan.train_len] if j.kind == kind]
        for kind in ("window", "short")
    }
    return window_keys(found["window"], found["short"])


def _asks(plan: Resolved, method: str, n: int, job: _Job) -> bool:
    """Whether ``method`` runs ``job`` at ``n``: LongPPL's truncated contexts are the model as trained's
    alone, and so are the tasks up to the trained length when the plan keeps them to its baseline."""
    if method == "none":
        return True
    if job.kind == "short":
        return False
    return not (job.kind == "trial" and plan.baseline_within and n <= plan.train_len)


def _todo(plan: Resolved, cells: dict, jobs: dict) -> list:
    """(method, length, jobs to run): each cell once, in the order of the methods; a cell shared with the
    model as trained runs what the model as trained runs."""
    todo, seen = [], set()
    for m in plan.methods:
        for n in (*plan.ladder, *plan.lengths):
            cell = cells[m, n]
            if cell is not None and id(cell) not in seen:
                seen.add(id(cell))
                runs = "none" if cells.get(("none", n)) is cell else m
                missing = [j for j in jobs[n] if j.item not in cell.items and _asks(plan, runs, n, j)]
                if missing:
                    todo.append((m, n, missing))
    return todo


def _extra(plan: Resolved, settings: ExtendSettings, tokenizer, left_out: dict) -> dict:
    """What results.json records of the passkey prompts and the task suite besides their results."""
    from posenc.real.passkey import KEY_DIGITS
    from posenc.real.tasks import ESSAY_SOURCE

    chat = bool(settings.chat and getattr(tokenizer, "chat_template", None))
    return {
        "budget": plan.budget,
        "passkey": {
            "trials": plan.passkey_trials,
            "digits": KEY_DIGITS,
            "seed": settings.seed,
            "chat_template": chat,
        },
        "tasks": {
            "names": list(plan.tasks),
            "left_out": left_out,
            "titles": {t: TASKS[t].title for t in plan.tasks},
            "trials": plan.trials,
            "questions": plan.questions,
            # per question its expected answer's tokens plus the slack, or the cap (posenc.real.tasks.answers)
            "answer_tokens": plan.answer_tokens,
            "answer_slack": plan.answer_slack,
            "seed": settings.seed,
            "chat_template": chat,
            "essay_haystack": ESSAY_SOURCE,
            "ladder": list(plan.ladder),
            "baseline_within": plan.baseline_within,
        },
        "layers": plan.layers,
    }


def _print_plans(treatments: dict) -> None:
    """What each method does to the model, before it runs (results.json records it too, as "plan")."""
    for m, t in treatments.items():
        print(f"{m}:\n  " + "\n  ".join(t.lines()), file=sys.stderr)


def _progress(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="extend", unit="tok", unit_scale=True, dynamic_ncols=True)
