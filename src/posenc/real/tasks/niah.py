"""Needle-in-a-haystack retrieval: RULER's NIAH family (Hsieh et al. 2024, arXiv:2404.06654, Section 3.1).

A needle is the sentence "One of the special magic numbers for {key} is: {value}." (key: two English words
with a hyphen; value: a 7-digit number; UUIDs for both in ``niah_multikey``). Several needles go in one
haystack, at evenly spaced depths, at sentence starts, and each question asks for one key's value(s), so
one reading of the haystack answers them all. RULER's templates and answer prefixes, in the plural for the
instruction (the haystack holds several needles) and in the singular for a question about one value.

- ``niah_noise`` (RULER's niah_single_1): in the noise sentences, a question per needle.
- ``niah_essay`` (niah_single_2): the same in real prose (:data:`~posenc.real.tasks.haystack.ESSAY_SOURCE`).
- ``niah_multikey`` (niah_multikey_3): a haystack of needles only, UUID keys and values; the asked needles
  at the depths, the others distractors.
- ``niah_multivalue``: each asked key has 4 values, spread over the haystack; a question asks all 4.
- ``niah_multiquery``: a question asks the values of 4 keys at once, spread over the haystack.
"""

from __future__ import annotations

from .base import Ask, Layout
from .haystack import ItemFiller, TextFiller, essay_text, noise_text
from .text import Draw, Text

__all__ = [
    "NEEDLE",
    "niah_essay",
    "niah_multikey",
    "niah_multiquery",
    "niah_multivalue",
    "niah_noise",
]

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
_INSTRUCTION = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {kind} afterwards.\n"
)
_ONE = (
    "\nWhat is the special magic {one} for {query} mentioned in the provided text?",
    " The special magic {one} for {query} mentioned in the provided text is",
)
_ALL = (
    "\nWhat are all the special magic {kind} for {query} mentioned in the provided text?",
    " The special magic {kind} for {query} mentioned in the provided text are",
)
VALUE_DIGITS = 7
PER_KEY = 4  # values of a key in niah_multivalue, keys of a question in niah_multiquery (RULER's 4)


def _ask(kind: str, query: Text, expected: list[Text], needle: int) -> Ask:
    """A question about ``query`` (one key, or several joined), singular for one expected value."""
    question, answer = _ONE if len(expected) == 1 else _ALL
    slots = {"kind": kind, "one": kind[:-1], "query": query}
    return Ask(Text.of(question, **slots), Text.of(answer, **slots), tuple(e.text for e in expected), needle)


def _needle(kind: str, key: Text, value: Text) -> Text:
    return Text.of(NEEDLE, kind=kind, key=key, value=value)


def _single(draw: Draw, questions: int, filler) -> Layout:
    """``questions`` needles of word keys and number values, a question for each."""
    keys = [draw.key() for _ in range(questions)]
    values = [draw.number(VALUE_DIGITS) for _ in range(questions)]
    needles = tuple(" " + _needle("numbers", k, v) for k, v in zip(keys, values, strict=True))
    asks = tuple(_ask("numbers", k, [v], i) for i, (k, v) in enumerate(zip(keys, values, strict=True)))
    return Layout(Text.of(_INSTRUCTION, kind="numbers"), asks, filler, needles)


def niah_noise(draw: Draw, questions: int, length: int) -> Layout:
    """Needles in the noise sentences."""
    return _single(draw, questions, TextFiller(noise_text))


def niah_essay(draw: Draw, questions: int, length: int) -> Layout:
    """Needles in real prose."""
    return _single(draw, questions, TextFiller(essay_text))


def niah_multikey(draw: Draw, questions: int, length: int) -> Layout:
    """``questions`` asked needles among needles of other UUID keys that fill the haystack, a line each (the
    line break ends the needle, so that each line tokenized alone is tokenized as in the whole text)."""
    keys = [draw.uuid() for _ in range(questions)]
    values = [draw.uuid() for _ in range(questions)]
    needles = tuple(_needle("uuids", k, v) + "\n" for k, v in zip(keys, values, strict=True))
    asks = tuple(_ask("uuids", k, [v], i) for i, (k, v) in enumerate(zip(keys, values, strict=True)))
    head = _needle("uuids", draw.uuid(), draw.uuid()) + "\n"
    filler = ItemFiller(head, lambda: _needle("uuids", draw.uuid(), draw.uuid()) + "\n")
    return Layout(Text.of(_INSTRUCTION, kind="uuids"), asks, filler, needles)


def niah_multivalue(draw: Draw, questions: int, length: int) -> Layout:
    """``questions`` keys of 4 values each; needle ``s`` is key ``s % questions``'s, so a key's values lie
    a quarter of the haystack apart and question ``j``'s first needle is needle ``j``."""
    keys = [draw.key() for _ in range(questions)]
    values = [[draw.number(VALUE_DIGITS) for _ in range(PER_KEY)] for _ in range(questions)]
    slots = range(questions * PER_KEY)
    needles = tuple(
        " " + _needle("numbers", keys[s % questions], values[s % questions][s // questions]) for s in slots
    )
    asks = tuple(_ask("numbers", k, v, i) for i, (k, v) in enumerate(zip(keys, values, strict=True)))
    return Layout(Text.of(_INSTRUCTION, kind="numbers"), asks, TextFiller(essay_text), needles)


def niah_multiquery(draw: Draw, questions: int, length: int) -> Layout:
    """``questions`` questions of 4 keys each; needle ``s`` is asked by question ``s % questions``."""
    keys = [draw.key() for _ in range(questions * PER_KEY)]
    values = [draw.number(VALUE_DIGITS) for _ in keys]
    needles = tuple(" " + _needle("numbers", k, v) for k, v in zip(keys, values, strict=True))
    asks = []
    for j in range(questions):
        mine = range(j, len(keys), questions)
        query = Text.join(", ", [keys[s] for s in mine][:-1]) + ", and " + keys[mine[-1]]
        asks.append(_ask("numbers", query, [values[s] for s in mine], j))
    return Layout(Text.of(_INSTRUCTION, kind="numbers"), tuple(asks), TextFiller(essay_text), needles)
