"""Long-context tasks for real models, RULER's (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", arXiv:2404.06654) and two classics, generated offline and deterministic
from a seed.

Each trial is one haystack of exactly the asked length and several questions over it
(:class:`~posenc.real.tasks.prompt.Trial`): the model reads the shared ``prefix`` once, each question
continues it and the model writes its answer, scored by :func:`score` (RULER's recall of the expected
strings). :data:`TASKS` maps a name to its :class:`~posenc.real.tasks.base.Task` record; a new task is one
module and one entry here. RULER's tasks ask one question of each haystack, as RULER does; the many-needle
variants (``niah_noise``, ``niah_essay``, ``niah_multikey``) ask several, and run only when named.

Each trial also knows its needle-free :attr:`~posenc.real.tasks.prompt.Trial.control` (the same haystack
without its needles) and each question its gold answer's tokens, for the answer's teacher-forced
likelihood with and without the needle (:mod:`posenc.real.trials`).

    >>> trials = make_trials("niah_single_1", tokenizer, 4096, 10, seed=0)   # doctest: +SKIP
    >>> min_length("cwe", tokenizer)                                        # doctest: +SKIP

The real-text haystack is :data:`ESSAY_SOURCE` (the Python documentation CPython ships; PSF License).
"""

from __future__ import annotations

import difflib

from . import cwe, fwe, kv, niah, passkey, vt
from .base import Task, least_length, make_trial, score
from .haystack import ESSAY_SOURCE
from .prompt import Frame, Question, Trial

__all__ = [
    "DEFAULT_TASKS",
    "ESSAY_SOURCE",
    "TASKS",
    "Question",
    "Task",
    "Trial",
    "check_tasks",
    "make_trials",
    "min_length",
    "score",
]

_RULER = (
    "Hsieh et al. 2024, RULER: What's the Real Context Size of Your Long-Context Language Models? "
    "(arXiv:2404.06654)"
)
_LITM = "Liu et al. 2023, Lost in the Middle: How Language Models Use Long Contexts (arXiv:2307.03172)"
_LANDMARK = (
    "Mohtashami & Jaggi 2023, Landmark Attention: Random-Access Infinite Context Length (arXiv:2305.16300)"
)

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("niah_single_1", "one needle in noise sentences", _RULER, 1, 128, niah.niah_noise, 1),
        Task("niah_single_2", "one needle in real prose", _RULER, 1, 128, niah.niah_essay, 1),
        Task("niah_single_3", "one UUID-valued needle in real prose", _RULER, 1, 128, niah.niah_single_3, 1),
        Task("niah_multikey_1", "one of 4 needles in real prose", _RULER, 1, 128, niah.niah_multikey_1, 1),
        Task("niah_multikey_2", "one needle among word-key needles", _RULER, 1, 128, niah.niah_multikey_2, 1),
        Task("niah_multikey_3", "one UUID needle among UUID needles", _RULER, 1, 128, niah.niah_multikey, 1),
        Task("niah_multivalue", "all 4 values of a key", _RULER, 1, 128, niah.niah_multivalue),
        Task("niah_multiquery", "the values of 4 keys at once", _RULER, 1, 128, niah.niah_multiquery),
        Task("vt", "variable tracking: a chain of 4 hops", _RULER, 1, 30, vt.vt),
        Task("cwe", "the 10 most common words of a list", _RULER, 1, 120, cwe.cwe, max_questions=1),
        Task("fwe", "the 3 most frequent coded words", _RULER, 1, 50, fwe.fwe, max_questions=1),
        Task("kv", "key-value retrieval from JSON", _LITM, 4, 100, kv.kv),
        Task(
            "passkey", "a five-digit pass key in filler", _LANDMARK, 1, 16, passkey.passkey, max_questions=1
        ),
        # many-needle variants: several needles, a question each, in one haystack (never run unless named)
        Task(
            "niah_noise", "needles in noise sentences", _RULER, 4, 128, niah.niah_noise, None, "niah_single_1"
        ),
        Task("niah_essay", "needles in real prose", _RULER, 4, 128, niah.niah_essay, None, "niah_single_2"),
        Task(
            "niah_multikey",
            "UUID needles among UUID needles",
            _RULER,
            4,
            128,
            niah.niah_multikey,
            None,
            "niah_multikey_3",
        ),
    )
}
"""name -> :class:`~posenc.real.tasks.base.Task`: RULER's tasks as RULER configures them, two classics, then
the many-needle variants (``variant_of`` set)."""

DEFAULT_TASKS = tuple(name for name, task in TASKS.items() if task.variant_of is None)
"""What runs when no task is named: every task but the many-needle variants."""


def _int(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")
    return value


def _did_you_mean(name: str) -> str:
    """The registered names that ``name`` begins, or else those it nearly spells, as a hint."""
    near = [t for t in TASKS if name and t.startswith(name)] or difflib.get_close_matches(
        name, list(TASKS), 3, 0.5
    )
    return f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""


def _chat(chat) -> bool:
    if not isinstance(chat, bool):
        raise ValueError(f"chat must be True or False, not {chat!r}")
    return chat


def _task(name) -> Task:
    """The registered task ``name``; a ValueError naming the allowed ones (and the nearest) otherwise."""
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    raise ValueError(f"task {name!r} is not one of {', '.join(TASKS)}{_did_you_mean(str(name))}")


def _questions(task: Task, questions) -> int:
    if questions is None:
        return task.questions
    most = task.max_questions
    if (
        isinstance(questions, bool)
        or not isinstance(questions, int)
        or not 1 <= questions <= (most or questions)
    ):
        allowed = f"1 to {most}" if most else "an integer >= 1"
        raise ValueError(
            f"questions for {task.name} must be {allowed} (or None for {task.questions}), not {questions!r}"
        )
    return questions


def check_tasks(names) -> list[str]:
    """``names`` (a list of task names, or one comma-separated string) as a list, each a registered task
    once; a ValueError naming ``--tasks``, the value and the allowed names otherwise."""
    listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    allowed = f"allowed: {', '.join(TASKS)}"
    if not listed or any(not isinstance(n, str) or not n for n in listed):
        raise ValueError(f"--tasks {names!r}: give one or more task names; {allowed}")
    for name in listed:
        if name not in TASKS:
            raise ValueError(f"--tasks {names!r}: unknown task {name!r}{_did_you_mean(name)}; {allowed}")
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if twice:
        raise ValueError(f"--tasks {names!r}: {', '.join(twice)} given more than once; {allowed}")
    return listed


def min_length(task: str, tokenizer, *, chat: bool = True, questions: int | None = None) -> int:
    """The shortest length :func:`make_trials` takes for ``task`` with this tokenizer (and framing, and
    number of questions): its fixed parts with every drawn text at its widest, and the smallest haystack.
    Cheap (no haystack is built), so a caller can refuse lengths before any work."""
    record = _task(task)
    return least_length(record, Frame(tokenizer, _chat(chat)), _questions(record, questions))


def make_trials(
    task: str,
    tokenizer,
    length: int,
    n_trials: int,
    *,
    seed: int,
    chat: bool = True,
    questions: int | None = None,
) -> list[Trial]:
    """``n_trials`` trials of ``task`` at ``length`` tokens, each with ``questions`` questions (default: the
    task's), in the tokenizer's chat template when ``chat`` and it has one.

    Trial i is the same for the same (task, length, i, seed, tokenizer, chat, questions) whatever
    ``n_trials`` is (its own generator, seeded from ``f"posenc-{task}-{seed}-{i}"``). Raises ValueError for a
    bad argument (named) and for a length under :func:`min_length` (naming the task, the length and the
    minimum).
    """
    record = _task(task)
    _int("length", length, 1)
    _int("n_trials", n_trials, 0)
    _int("seed", seed, 0)
    asked = _questions(record, questions)
    frame = Frame(tokenizer, _chat(chat))
    least = least_length(record, frame, asked)
    if length < least:
        raise ValueError(
            f"{task}: length {length} is too short: with this tokenizer and {asked} question(s) the task "
            f"needs at least {least} tokens (min_length); use longer lengths or fewer questions"
        )
    return [make_trial(record, frame, length, i, seed, asked) for i in range(n_trials)]
