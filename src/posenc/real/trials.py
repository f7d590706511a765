"""One trial of a task for one method at one length: its prefix run once, its questions answered from it.

:func:`run_trial` runs a :class:`~posenc.real.tasks.prompt.Trial` on a :class:`~posenc.real.continuation.
Continuation` and scores every answer as RULER does (:func:`posenc.real.tasks.score`: the share of the
expected strings the answer contains; Hsieh et al. 2024, arXiv:2404.06654). Its result is what a cell saves
(:mod:`posenc.real.extend`), JSON-ready::

    {"task", "index", "prefill_s", "seconds", "peak_mib",
     "questions": [{"id", "depth", "expected", "answer", "score", "seconds"}, ...]}

``prefill_s`` is the shared forward, ``seconds`` the whole trial; a question's own ``seconds`` is its
continuation and decoding (questions of equal length run as one batch, :meth:`Continuation.answers`: each
of them is given the batch's time over its questions).
"""

from __future__ import annotations

import hashlib
import json
import time

import torch

from posenc.real.continuation import Ask, Continuation
from posenc.real.tasks import score
from posenc.runs.memory import measured_peak

__all__ = ["run_trial", "trial_item"]


def trial_item(trial) -> str:
    """The key a trial's result is saved under: its task and index, and a digest of every token it reads
    and every answer budget, so that a changed task never reuses an old answer."""
    h = hashlib.sha256(json.dumps(list(trial.prefix)).encode())
    for q in trial.questions:
        h.update(json.dumps([list(q.ids), list(q.expected), q.max_new_tokens]).encode())
    return f"trial/{trial.task}/{trial.index}/{h.hexdigest()[:16]}"


def run_trial(runner: Continuation, trial, device: torch.device) -> dict:
    """Answer every question of ``trial`` from one run of its prefix (module docstring)."""
    t0 = time.perf_counter()
    with measured_peak(device) as peak:
        # a prefix that ends where its buffer ends is contiguous: the batches read it without a copy
        reserve = (
            0 if runner.batches else max((len(q.ids) + q.max_new_tokens for q in trial.questions), default=0)
        )
        cache, snapshot = runner.prefill(trial.prefix, reserve=reserve)
        prefill_s = time.perf_counter() - t0
        # recall of the expected strings cannot grow past 1: a full answer is final (RULER's score of the
        # whole budget, at a fraction of the decoding)
        asks = [
            Ask(tuple(q.ids), q.max_new_tokens, lambda text, q=q: score(q.expected, text) == 1.0)
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
        "questions": questions,
    }
