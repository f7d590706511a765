"""The trials of a task at one length for one method: answered, and their gold answers scored with and without
the needle.

:func:`run_trials` runs :class:`~posenc.real.tasks.prompt.Trial`\\ s on a :class:`~posenc.real.continuation.
Continuation`. Per question it records:

- the greedy answer and its RULER score (:func:`posenc.real.tasks.score`: the share of the expected strings
  the answer contains; Hsieh et al. 2024, arXiv:2404.06654);
- ``logprob``: the gold answer's teacher-forced log-likelihood after the answer prefix, in nats, summed over
  its ``gold_tokens`` tokens: a score that does not floor at 0 when the greedy answer misses (the gold
  answer's likelihood tracks RULER's scores across models more closely than hit/miss: Liang et al. 2026,
  arXiv:2604.02650);
- ``control_logprob``: the same in the trial's needle-free control (:attr:`Trial.control`, the same haystack
  without its needles): what the model guesses of the answer without having read it;
- ``gain``: (logprob - control_logprob) / gold_tokens, the needle's gain in nats per answer token.

The trials of one task and length share their haystack, and a trial's tokens before its first needle are
the control's. So the longest control is run once, in pieces that end where each trial's needle (and each
shorter control) begins, keeping the cache at each of those points; a trial continues from the cache at its
needle (on average half a forward), a control from the cache at its own end (no forward at all). The
pieces are visited from the latest point to the earliest, since continuing from a point writes over the
cache after it. A model whose rotary depends on the length of the call (dynamic NTK) would rotate the pieces
otherwise than one forward does: there every trial and every control is run whole.

A result is JSON-ready (what a cell saves, :mod:`posenc.real.extend`)::

    {"task", "index", "prefill_s", "shared_s", "control_s", "seconds", "peak_mib", "shared_tokens",
     "questions": [{"id", "depth", "expected", "answer", "score", "seconds",
                    "gold_tokens", "logprob", "control_logprob", "gain"}, ...]}

``prefill_s`` is the trial's own forward (from its needle on), ``shared_s`` its share of the control's
forward, ``control_s`` its control's scoring, ``seconds`` the whole trial with both, ``shared_tokens`` the
tokens it took from the control's forward.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence

import torch

from posenc.hf.shared_prefix import length_dependent_positions
from posenc.real.continuation import Continuation, Request, gold_logprob
from posenc.real.tasks import score
from posenc.runs.memory import measured_peak

__all__ = ["TRIAL_VERSION", "common_prefix", "run_trial", "run_trials", "shared_base", "trial_item"]

TRIAL_VERSION = 2  # 2: gold answers scored with and without the needle


def trial_item(trial) -> str:
    """The key a trial's result is saved under: its task and index, and a digest of every token it reads,
    its needles' places, every gold answer and answer budget, so that a changed task never reuses an old
    answer."""
    h = hashlib.sha256(json.dumps([TRIAL_VERSION, list(trial.prefix), trial.needle_spans]).encode())
    for q in trial.questions:
        h.update(json.dumps([list(q.ids), list(q.expected), q.max_new_tokens, list(q.gold)]).encode())
    return f"trial/{trial.task}/{trial.index}/{h.hexdigest()[:16]}"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their start."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_base(trials: Sequence) -> tuple[int, ...]:
    """The needle-free haystack the trials of one task and length share: their longest control (every
    shorter control is a prefix of it, and a trial's tokens before its first needle are); () without one."""
    return max((t.control for t in trials if t.control is not None), key=len, default=())


def _reserve(trial) -> int:
    """The tokens a question, its gold answer or its own answer may add after the trial's prefix."""
    return max((len(q.ids) + max(q.max_new_tokens, len(q.gold)) for q in trial.questions), default=0)


def run_trial(runner: Continuation, trial, device: torch.device) -> dict:
    """One trial alone: its prefix and its control each run whole (module docstring)."""
    found = {}
    run_trials(runner, [trial], device, lambda t, r: found.setdefault("result", r))
    return found["result"]


def run_trials(
    runner: Continuation, trials: Sequence, device: torch.device, save: Callable[[object, dict], None]
) -> None:
    """Answer and score every trial of ``trials`` (one task at one length), sharing their needle-free
    haystack's forward where the model allows it (module docstring); ``save(trial, result)`` is called as
    each trial is done, so that a killed run keeps the trials it finished."""
    if not trials:
        return
    t0 = time.perf_counter()
    controls = [t.control for t in trials]
    shared = not length_dependent_positions(runner.model) and any(c is not None for c in controls)
    base = shared_base(trials) if shared else ()
    reserve = max(_reserve(t) for t in trials)
    starts = {}  # (trial index, "trial" | "control") -> tokens taken from the base
    for i, t in enumerate(trials):
        starts[i, "trial"] = common_prefix(t.prefix, base) if shared else 0
        if controls[i] is not None:
            starts[i, "control"] = common_prefix(controls[i], base) if shared else 0
    cuts = sorted({s for s in starts.values() if s > 0})
    base_cache, points = None, {}
    if cuts:
        # room for the longest trial and its questions: no trial grows the buffer
        room = max(len(t.prefix) for t in trials) + reserve - cuts[-1]
        base_cache, points = runner.prefill_at(base[: cuts[-1]], cuts, reserve=room)
    base_s = (time.perf_counter() - t0) / len(trials)
    control_lp: dict[int, list[float]] = {}
    control_s: dict[int, float] = {}
    # latest point first: continuing from a point writes over the base's cache after it; at one point a
    # control before its trial, whose gain needs it
    order = sorted(starts.items(), key=lambda item: (-item[1], item[0][1] == "trial"))
    for (i, kind), start in order:
        trial = trials[i]
        if kind == "control":
            t1 = time.perf_counter()
            control_lp[i] = _control(runner, trial, controls[i], start, base_cache, points, reserve)
            control_s[i] = time.perf_counter() - t1
            continue
        result = _trial(runner, trial, start, base_cache, points, reserve, device)
        for q, lp0 in zip(result["questions"], control_lp.get(i, [None] * len(trial.questions)), strict=True):
            q["control_logprob"] = None if lp0 is None else round(lp0, 6)
            q["gain"] = None if lp0 is None else round((q["logprob"] - lp0) / q["gold_tokens"], 6)
        result["shared_s"] = round(base_s, 3)
        result["control_s"] = round(control_s.get(i, 0.0), 3)
        result["seconds"] = round(result["seconds"] + base_s + control_s.get(i, 0.0), 3)
        save(trial, result)


def _from(runner: Continuation, ids, start: int, base_cache, points: dict, reserve: int):
    """A cache of ``ids`` and its snapshot: the base's cache at ``start`` continued with the rest, or ``ids``
    run whole when nothing is shared (``start`` 0)."""
    if start == 0:
        return runner.prefill(ids, reserve=reserve)
    snapshot = points[start]
    if start == len(ids):
        return base_cache, snapshot
    return base_cache, runner.extend(base_cache, snapshot, ids[start:])


def _control(runner, trial, control, start, base_cache, points, reserve) -> list[float]:
    cache, snapshot = _from(runner, control, start, base_cache, points, reserve)
    return [gold_logprob(runner, cache, snapshot, q.ids, q.gold) for q in trial.questions]


def _trial(runner: Continuation, trial, start: int, base_cache, points, reserve: int, device) -> dict:
    t0 = time.perf_counter()
    with measured_peak(device) as peak:
        cache, snapshot = _from(runner, trial.prefix, start, base_cache, points, reserve)
        prefill_s = time.perf_counter() - t0
        # recall of the expected strings cannot grow past 1: a full answer is final (RULER's score of the
        # whole budget, at a fraction of the decoding)
        asks = [
            Request(tuple(q.ids), q.max_new_tokens, lambda text, q=q: score(q.expected, text) == 1.0)
            for q in trial.questions
        ]
        answers = runner.answers(cache, snapshot, asks)
        questions = [
            {
                "id": trial.question_id(i),
                "depth": q.depth,
                "expected": list(q.expected),
                "answer": answer.text,
                "score": score(q.expected, answer.text),
                "seconds": round(answer.seconds, 3),
                "gold_tokens": len(q.gold),
                "logprob": round(gold_logprob(runner, cache, snapshot, q.ids, q.gold), 6),
            }
            for i, (q, answer) in enumerate(zip(trial.questions, answers, strict=True))
        ]
        del cache, snapshot
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return {
        "task": trial.task,
        "index": trial.index,
        "prefill_s": round(prefill_s, 3),
        "seconds": round(time.perf_counter() - t0, 3),
        "peak_mib": round(peak() / 2**20, 1),
        "shared_tokens": start,
        "questions": questions,
    }
