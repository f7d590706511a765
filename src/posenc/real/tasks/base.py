"""What every task shares: its record (:class:`Task`), the text it lays out (:class:`Layout`), how that text
becomes a :class:`~posenc.real.tasks.prompt.Trial` of an exact length (:func:`make_trial`), the fewest tokens
it can take (:func:`least_length`), and RULER's score (:func:`score`).

A task's ``build(draw, questions, length)`` draws its trial's text from ``draw`` (the trial's own random
strings) and returns a :class:`Layout`: the instruction, the needles (in haystack order) and the questions,
and a filler that makes the rest of the haystack. :func:`make_trial` tokenizes it in the model's
:class:`~posenc.real.tasks.prompt.Frame`, gives the filler every token the longest question and its answer
leave, and puts the needles in at a grid of depths.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .haystack import Filler
from .prompt import Frame, Question, Trial, encode, encode_many
from .text import Draw, Text

__all__ = ["Ask", "Layout", "Task", "depths", "least_length", "make_trial", "score", "trial_rng"]


class Filling(Protocol):
    def fewest(self, tokenizer) -> int: ...

    def build(self, tokenizer, room: int) -> Filler: ...


@dataclass(frozen=True)
class Ask:
    """One question: its ``question`` text (after the haystack), ``answer_prefix`` (where the answer starts),
    the ``expected`` strings, ``needle``: the index among the layout's needles of its first one (None for a
    question without needles), and ``separator``: what joins the expected strings in the gold answer that
    is scored teacher-forced (", " for values, " " for variable names, as the task's example writes them)."""

    question: Text
    answer_prefix: Text
    expected: tuple[str, ...]
    needle: int | None = None
    separator: str = ", "

    def gold(self) -> str:
        """The gold answer as the model would write it after the answer prefix: a space, then every expected
        string joined by ``separator``."""
        return " " + self.separator.join(self.expected)


@dataclass(frozen=True)
class Layout:
    """A trial's text before tokenizing: ``instruction`` (before the haystack), ``asks``, ``filler`` (makes
    the haystack's other tokens), ``needles`` (each carries its separator from the text around it: the
    space before a sentence, the line break or comma after a unit) and ``depths`` (where each needle goes,
    0 to 1, when the task draws them)."""

    instruction: Text
    asks: tuple[Ask, ...]
    filler: Filling
    needles: tuple[Text, ...] = ()
    depths: tuple[float, ...] | None = None  # each needle's, sorted (None: :func:`depths`' rule)


@dataclass(frozen=True)
class Task:
    """A registered task: ``name`` (as ``--tasks`` takes it), ``title``, ``source`` (the paper its
    definition comes from), ``questions`` (asked per haystack by default), ``max_new_tokens`` (the longest
    answer, as the source sets it), ``build`` (draw, questions, length) -> :class:`Layout`, the function that
    builds a trial's text, ``max_questions`` (None: as many as the length holds), and ``variant_of``: the
    RULER task whose haystack a many-needle variant asks many questions of (None: a task as its source
    defines it; only those run unless named)."""

    name: str
    title: str
    source: str
    questions: int
    max_new_tokens: int
    build: Callable[[Draw, int, int], Layout]
    max_questions: int | None = None
    variant_of: str | None = None


def trial_rng(task: str, seed: int, index: int) -> random.Random:
    """The random generator of trial ``index`` of ``task``: its own, so a trial does not depend on how many
    others are drawn."""
    return random.Random(f"posenc-{task}-{seed}-{index}")


def _van_der_corput(i: int) -> float:
    """i's binary digits mirrored after the point: 0, 1/2, 1/4, 3/4, 1/8, ... (every prefix evenly spread)."""
    out, scale = 0.0, 0.5
    while i:
        out += scale * (i & 1)
        i >>= 1
        scale /= 2
    return out


def depths(needles: int, index: int) -> list[float]:
    """Where ``needles`` needles go, 0 (the haystack's start) to 1 (its end): evenly spaced from 0 to 1; a
    single needle at 1/2, 0, 3/4, 1/4, 5/8, ... in trial ``index`` (the van der Corput sequence moved by a
    half), so that the first n trials spread it evenly whatever n is."""
    if needles == 1:
        return [(0.5 + _van_der_corput(index)) % 1.0]
    return [i / (needles - 1) for i in range(needles)]


def _place(filler: Filler, needles: list[list[int]], where: list[float], room: int):
    """The haystack (filler with ``needles`` in, each at the last needle start at or before its depth's
    token) and the index of each needle in it."""
    haystack: list[int] = []
    at, prev = [], 0
    for depth, needle in zip(where, needles, strict=True):
        target = round(depth * room)
        cut = max((s for s in filler.starts if s <= target), default=filler.starts[0])
        haystack += filler.ids[prev:cut]
        at.append(len(haystack))
        haystack += needle
        prev = cut
    return haystack + filler.ids[prev:], at


def make_trial(task: Task, frame: Frame, length: int, index: int, seed: int, questions: int) -> Trial:
    """Trial ``index`` of ``task`` at ``length`` tokens: ``prefix`` plus the longest question's tokens and
    its answer's ``max_new_tokens`` make exactly ``length``. Raises ValueError when this trial's text does
    not fit (:func:`least_length` refuses such lengths first)."""
    layout = task.build(Draw(trial_rng(task.name, seed, index)), questions, length)
    tokenizer = frame.tokenizer
    instruction = frame.instruction(layout.instruction.text)
    tails = [frame.continuation(a.question.text, a.answer_prefix.text) for a in layout.asks]
    needles = encode_many(tokenizer, [n.text for n in layout.needles])
    fixed = len(instruction) + max(map(len, tails)) + task.max_new_tokens + sum(map(len, needles))
    room = length - fixed
    if room < layout.filler.fewest(tokenizer):
        raise ValueError(
            f"{task.name}: length {length} is too short for trial {index}: its fixed parts take {fixed} "
            f"tokens and its haystack at least {layout.filler.fewest(tokenizer)}"
        )
    where = list(layout.depths) if layout.depths is not None else depths(len(needles), index)
    haystack, at = _place(layout.filler.build(tokenizer, room), needles, where, room)
    prefix = tuple(instruction + haystack)
    golds = encode_many(tokenizer, [a.gold() for a in layout.asks])
    asked = tuple(
        Question(
            ids=tuple(tail),
            expected=a.expected,
            depth=None if a.needle is None else where[a.needle],
            needle_at=None if a.needle is None else len(instruction) + at[a.needle],
            max_new_tokens=task.max_new_tokens,
            gold=tuple(gold),
        )
        for a, tail, gold in zip(layout.asks, tails, golds, strict=True)
    )
    spans = tuple(
        (len(instruction) + a, len(instruction) + a + len(n)) for a, n in zip(at, needles, strict=True)
    )
    return Trial(task.name, index, length, prefix, asked, haystack_at=len(instruction), needle_spans=spans)


def least_length(task: Task, frame: Frame, questions: int) -> int:
    """The fewest tokens a trial of ``task`` with ``questions`` questions can need, whatever is drawn: every
    drawn text at its widest (:meth:`Text.bound`), the haystack at its smallest."""
    layout = task.build(Draw(random.Random(f"posenc-{task.name}-least")), questions, 0)
    tokenizer = frame.tokenizer
    instruction = layout.instruction.bound(len(frame.instruction(layout.instruction.fixed)))
    tails = [
        len(frame.continuation(a.question.fixed, a.answer_prefix.fixed))
        + (a.question + a.answer_prefix).bound(0)
        for a in layout.asks
    ]
    needles = sum(n.bound(len(encode(tokenizer, n.fixed))) for n in layout.needles)
    return instruction + max(tails) + task.max_new_tokens + needles + layout.filler.fewest(tokenizer)


def score(expected: Sequence[str], answer_text: str) -> float:
    """RULER's metric (string_match_all, Hsieh et al. 2024): the fraction of ``expected`` strings that occur
    in ``answer_text``, ignoring case; in [0, 1]."""
    if isinstance(expected, str) or not isinstance(expected, Sequence) or not expected:
        raise ValueError(f"expected must be a non-empty list of strings, not {expected!r}")
    if not all(isinstance(e, str) and e for e in expected):
        raise ValueError(f"expected must hold non-empty strings, not {list(expected)!r}")
    if not isinstance(answer_text, str):
        raise ValueError(f"answer_text must be a string, not {type(answer_text).__name__}")
    answer = answer_text.lower()
    return sum(e.lower() in answer for e in expected) / len(expected)
