"""``posenc compare``: train every encoding the same way at a short length, evaluate each at longer ones.

The reproduction of the ALiBi paper's headline figure (Press et al. 2021, fig. 1) and of the literature's
length-extrapolation section at toy scale: same corpus, seed, model size, steps and batches for
every scheme; only the positional encoding differs. RoPE is additionally evaluated with eval-time
context extensions (PI, NTK, YaRN) at factor = eval length / train length.

This module schedules the work; :mod:`posenc.lab.config` defines the settings and presets,
:mod:`posenc.lab.report` writes the files and :mod:`posenc.lab.progress` shows progress.

Output in ``--out`` (docs/lab.md has the schema):
    results.json       {"train_len", "eval_lens", "corpus", "seeds", "protocols", "provenance", "results":
                       [{"scheme", "seeds", "ppl", "ppl_sd", <each protocol and probe and its _sd>,
                       "per_seed", "note"}]}
    results.md         a table per protocol (the windows one also printed), far-context gain, copy probe
    details.json       settings, timings, every row as measured
    extrapolation.png  perplexity vs evaluation length (log scale, sd error bars), far-context gain
    models/<scheme>/seed-<s>/   each model's checkpoints and eval rows: a killed compare resumes, skipping
                       finished work

Tasks (:class:`posenc.lab.tasks.Task`): one per (scheme, seed) (train it, evaluate it), and its follow-ups,
one per eval-time extension that applies (evaluate that trained model with it) and one per recipe that
applies (continue it, evaluate that). They run in worker processes, one thread each on CPU and all at
once by default (up to 8): these matrices are too small for one process to keep many cores busy, and a
worker per model keeps every core working until the end. Results do not depend on --jobs. The seeds'
rows are combined into one per scheme (:func:`posenc.lab.stats.combine_seeds`).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.managers import SyncManager
from pathlib import Path

import torch

from posenc.lab.checkpoint import (
    check_resumable,
    is_complete,
    latest_checkpoint,
    load_model,
    run_state,
)
from posenc.lab.checks import check_int
from posenc.lab.config import Settings
from posenc.lab.context_parallel import check_context_run
from posenc.lab.data import load_corpus
from posenc.lab.encodings import extensions_for
from posenc.lab.errors import LabError
from posenc.lab.evaluate import perplexities
from posenc.lab.layers import build, plan_of
from posenc.lab.measures import MEASURE_NAMES
from posenc.lab.progress import CompareProgress, InlineQueue
from posenc.lab.provenance import provenance
from posenc.lab.report import write_reports
from posenc.lab.runtime import check_device, exit_with_parent, worker_init
from posenc.lab.stats import combine_seeds
from posenc.lab.tasks import Comparison, Task
from posenc.lab.train import compile_backend, train
from posenc.runs.files import write_text_atomic

__all__ = ["CompareResult", "run_compare"]


# ---------------------------------------------------------------------------------------------- one task


def _run_task(task: Task, run: Comparison, events) -> dict:
    """Do ``task`` of the comparison ``run`` (train unless trained, evaluate); returns the row (with its
    ``"seed"``); reports to ``events`` (``put``).

    Each (scheme, seed) is its own run directory (:meth:`Task.base_run`; a recipe's model inside it) and
    each row is saved there keyed by what it depends on (:func:`_row_key`), so a rerun, or one asking for
    more seeds, skips what is done.
    """
    s, extension = run.settings, task.extension
    run_dir = task.run_dir(run.out, s)
    label = task.label(s)
    eval_path = run_dir / (f"eval-{extension}.json" if extension else "eval.json")
    key = _row_key(s, task.seed, run.corpus, task.recipe)
    saved = _saved_row(eval_path, key)
    if saved is not None:
        events.put(("done", label, "cached"))
        return saved
    data = load_corpus(run.corpus, cache_dir=run.cache_dir)
    t0 = time.perf_counter()
    if extension is None:
        configs = (
            s.recipe_configs(task.scheme, task.seed, task.recipe, str(task.base_run(run.out)))
            if task.recipe
            else (s.model_config(task.scheme), s.train_config(task.seed))
        )
        _train_once(*configs, run, run_dir, data, events, label)
    train_s = time.perf_counter() - t0
    model, _ = load_model(run_dir, run.device)
    events.put(("eval", label, None))
    t1 = time.perf_counter()
    r = perplexities(
        model,
        data.val,
        s.eval_lens,
        train_len=s.train_len,
        max_tokens=s.eval_tokens,
        extension=extension,
        progress=lambda what: events.put(("eval", label, what.split(" @ ")[-1])),
        protocols=s.protocols,
        sliding_tokens=s.sliding_tokens,
        probe_windows=s.probe_windows,
        passkey_trials=s.passkey_trials,
    )
    row = {
        **r.to_dict(),
        "scheme": task.name,
        "seed": task.seed,
        "train_s": round(train_s, 1),
        "eval_s": round(time.perf_counter() - t1, 1),
    }
    write_text_atomic(eval_path, json.dumps({"key": key, "row": row}, indent=2))
    events.put(("done", label, None))
    return row


def _train_once(model_cfg, train_cfg, run: Comparison, run_dir: Path, data, events, label):
    """Train into ``run_dir``, resuming a partial run; a finished model is reused only if it was trained
    with these settings (--lr, --copy-fraction...), else a CheckpointError. With ``run.context_parallel``
    N > 1, on N spawned gloo processes sharing every sequence (:mod:`posenc.lab.context_ranks`), whose
    logged losses are shown when they finish."""
    if is_complete(run_dir, train_cfg.steps):
        latest = latest_checkpoint(run_dir)
        saved = json.loads((latest / "state.json").read_text())
        check_resumable(saved, run_state(model_cfg, train_cfg, data.path), latest)
        return
    ckpt_every = run.settings.ckpt_every
    if run.context_parallel > 1:
        from posenc.lab.context_ranks import train_on_ranks

        threads = max(1, torch.get_num_threads() // run.context_parallel)
        options = dict(corpus=run.corpus, cache_dir=run.cache_dir, ckpt_every=ckpt_every, compile=run.compile)
        for step, loss, tps in train_on_ranks(
            run.context_parallel, threads, model_cfg, train_cfg, run_dir, **options
        ):
            events.put(("step", label, step, loss, tps))
        return
    train(
        model_cfg,
        train_cfg,
        run_dir,
        corpus=data,
        resume=True,
        ckpt_every=ckpt_every,
        device=run.device,
        progress=False,
        compile=run.compile,
        callback=lambda step, loss, tps: events.put(("step", label, step, loss, tps)),
    )


def _row_key(s: Settings, seed: int, corpus: str | None, recipe: str | None = None) -> dict:
    """What one seed's saved row depends on: every setting but the list of schemes, extensions and
    seeds (a rerun with more schemes or seeds reuses the rows it has), with the row's own seed; the
    recipes' settings only for a recipe's row."""
    left_out = ("schemes", "extensions", "seeds", "recipes") + (
        () if recipe else ("extend_to", "extend_steps")
    )
    settings = {k: v for k, v in s.to_json().items() if k not in left_out}
    return {"settings": {**settings, "seed": seed}, "corpus": corpus}


def _saved_row(eval_path: Path, key: dict) -> dict | None:
    """The row an earlier run saved at ``eval_path`` for the same settings and corpus (``key``), or None.

    A file that does not parse (damaged on disk, edited by hand) is set aside as ``<name>.corrupt``, said on
    stderr, and the row evaluated again: it is derived from the checkpoint, which is kept. A row saved
    before one of the measures existed is evaluated again too."""
    if not eval_path.exists():
        return None
    try:
        saved = json.loads(eval_path.read_text())
        row = saved["row"] if saved.get("key") == key else None
        if row is not None and any(name not in row for name in MEASURE_NAMES):
            row = None  # saved before a measure existed: evaluate again, the checkpoint is kept
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        aside = eval_path.with_name(eval_path.name + ".corrupt")
        os.replace(eval_path, aside)
        print(
            f"posenc compare: {str(eval_path)!r} is corrupt ({err}); moved to {aside.name}, evaluating again",
            file=sys.stderr,
        )
        return None
    return row


# ---------------------------------------------------------------------------------------------- scheduling


def _task_order(settings: Settings) -> tuple[list[Task], dict[Task, list[Task]]]:
    """The training tasks in the order to start them (each scheme's seeds together), and the follow-up
    tasks each one's completion unlocks: its eval-time extensions, then its recipes.

    RoPE first: its follow-up tasks can start only once it is trained, and then run in parallel with
    the rest instead of one after another at the end. Then ALiBi, the others by name, learned last.
    """
    schemes = sorted(settings.schemes, key=lambda s: (s != "rope", s != "alibi", s == "learned", s))
    order = [Task(sc, seed) for sc in schemes for seed in _seeds(settings)]
    followups = {
        base: [replace(base, extension=e) for e in extensions_for(base.scheme, settings.extensions)]
        + [replace(base, recipe=r) for r in settings.recipes_for(base.scheme)]
        for base in order
    }
    return order, followups


def _seeds(settings: Settings) -> list[int]:
    """The seeds of a comparison: ``seed`` .. ``seed + seeds - 1``, each a model per scheme."""
    return [settings.seed + i for i in range(settings.seeds)]


def _run_inline(order, followups, run: Comparison, display: CompareProgress) -> dict[Task, dict]:
    """Every task in this process, one after another: each training task, then its follow-ups."""
    sink = InlineQueue(display.handle)
    rows = {}
    for base in order:
        for task in [base, *followups.get(base, [])]:
            rows[task] = _run_task(task, run, sink)
    return rows


def _run_pool(order, followups, run: Comparison, display, jobs: int, threads: int) -> dict[Task, dict]:
    """Every task in ``jobs`` worker processes of ``threads`` torch threads; each (scheme, seed) is a task
    of its own, and its follow-up tasks are submitted as soon as it finishes. A worker's exception is
    re-raised here."""
    ctx = mp.get_context("spawn")
    rows = {}
    manager = SyncManager(ctx=ctx)
    manager.start(exit_with_parent, (os.getpid(),))
    with manager:
        events = manager.Queue()
        with ProcessPoolExecutor(
            jobs, mp_context=ctx, initializer=worker_init, initargs=(threads, os.getpid())
        ) as pool:
            running = {pool.submit(_run_task, task, run, events): task for task in order}
            while running:
                _show_events(events, display, wait=0.5, most=1)
                for f in [f for f in running if f.done()]:
                    task = running.pop(f)
                    rows[task] = f.result()
                    for follow in followups.get(task, []):
                        running[pool.submit(_run_task, follow, run, events)] = follow
        _show_events(events, display)
    return rows


def _show_events(events, display: CompareProgress, wait: float = 0.0, most: int | None = None) -> None:
    """Pass queued events to the display: up to ``most`` (all when None), waiting up to ``wait`` s for one."""
    shown = 0
    while most is None or shown < most:
        try:
            display.handle(events.get(timeout=wait) if wait else events.get_nowait())
        except queue.Empty:
            return
        shown += 1


# ---------------------------------------------------------------------------------------------- driver


@dataclass
class CompareResult:
    settings: Settings
    rows: list[dict]
    wall_s: float
    out: Path
    table: str = field(default="")


def _display(settings: Settings, order: list[Task], progress: bool) -> CompareProgress:
    """The progress display: a line per training task, then per recipe (those train too), by scheme and
    recipe, seeds together."""
    labels = [t.label(settings) for t in order]
    recipes = [
        Task(sc, seed, recipe=r).label(settings)
        for sc in dict.fromkeys(t.scheme for t in order)
        for r in settings.recipes_for(sc)
        for seed in _seeds(settings)
    ]
    total = settings.steps * len(labels) + settings.extend_steps * len(recipes)
    return CompareProgress(total, labels + recipes, enabled=progress)


def _layer_plans(s: Settings) -> dict:
    """Each model's per-layer plan (each block's kind and options, :mod:`posenc.lab.layers`) by row name,
    for the schemes and recipes that have one; the others attend alike in every layer."""
    plans = {}
    for scheme in s.schemes:
        for recipe in [None, *s.recipes_for(scheme)]:
            cfg = s.recipe_configs(scheme, s.seed, recipe, "")[0] if recipe else s.model_config(scheme)
            plan = plan_of(build(cfg))
            if plan is not None:
                plans[Task(scheme, s.seed, recipe=recipe).name] = plan
    return plans


def _check_context_parallel(s: Settings, size: int, device: str) -> None:
    """Refuse, before any work, context parallelism off the CPU or for a model it cannot train."""
    check_int("context_parallel", size)
    if size > 1 and device != "cpu":
        raise LabError(
            f"--context-parallel {size} trains each model on {size} gloo processes on the CPU; got "
            f"--device {device} (on GPUs: posenc train --context-parallel under torchrun)"
        )
    for scheme in s.schemes if size > 1 else ():
        for seed in _seeds(s):
            check_context_run(s.model_config(scheme), s.train_config(seed), size, size)
            for recipe in s.recipes_for(scheme):  # a recipe's model trains on the ranks too
                check_context_run(*s.recipe_configs(scheme, seed, recipe, "."), size, size)


def _val_tokens_needed(s: Settings) -> int:
    """Validation tokens the protocols need: the longest window, and for the sliding protocol at least one
    stride after it (it scores the tokens after the longest length, so that every length scores them)."""
    longest = max(s.eval_lens)
    return longest + (s.train_len if "sliding" in s.protocols else 0) + 1


def _workers(jobs: int | None, device: str, settings: Settings) -> tuple[int, int]:
    """Worker processes and torch threads per worker."""
    if jobs is None:
        # On CPU all schemes train at once, one thread each: the cores are shared fairly and no core
        # idles at the end waiting for a last model (5 models on 2 workers would leave one alone).
        jobs = 1 if device != "cpu" else max(1, min(len(settings.schemes) * settings.seeds, 8))
    check_int("jobs", jobs)
    threads = max(1, (os.cpu_count() or 1) // jobs) if device == "cpu" else torch.get_num_threads()
    return jobs, threads


def run_compare(
    out: str | os.PathLike,
    settings: Settings,
    *,
    corpus: str | None = None,
    cache_dir: str | None = None,
    device: str = "cpu",
    jobs: int | None = None,
    progress: bool = True,
    compile: bool | str = False,
    context_parallel: int = 1,
) -> CompareResult:
    """Train and evaluate every scheme of ``settings``, write the report files into ``out``.

    ``compile`` trains each model through ``torch.compile`` (see :func:`posenc.lab.train.train`);
    ``context_parallel`` N > 1 trains each on N gloo processes on the CPU that share every sequence
    (:mod:`posenc.lab.context_ranks`), each with its share of the worker's threads.
    """
    t0 = time.perf_counter()
    check_device(device)
    compile_backend(compile)  # a bad backend is refused before any worker starts
    _check_context_parallel(settings, context_parallel, device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # Load once here: errors about the corpus surface before any worker starts, and the token cache is
    # built once.
    data = load_corpus(
        corpus,
        cache_dir=cache_dir,
        min_train_tokens=settings.train_len * settings.batch_size + 2,
        min_val_tokens=_val_tokens_needed(settings),
    )
    record = {**provenance(settings.to_json(), data, device), "layers": _layer_plans(settings)}
    jobs, threads = _workers(jobs, device, settings)
    order, followups = _task_order(settings)
    display = _display(settings, order, progress)
    run = Comparison(settings, str(out), corpus, cache_dir, device, compile, context_parallel)
    if jobs == 1:
        rows = _run_inline(order, followups, run, display)
    else:
        rows = _run_pool(order, followups, run, display, jobs, threads)
    display.close()

    ordered = [
        combine_seeds([rows[replace(variant, seed=seed)] for seed in _seeds(settings)])
        for sc in settings.schemes
        for variant in [Task(sc, settings.seed), *followups[Task(sc, settings.seed)]]
    ]
    wall = time.perf_counter() - t0
    corpus_path = str(Path(data.path).resolve())
    table = write_reports(
        out, settings, ordered, corpus=corpus_path, device=device, wall_s=wall, provenance=record
    )
    return CompareResult(settings=settings, rows=ordered, wall_s=wall, out=out, table=table)
