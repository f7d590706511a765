"""Needle-in-a-haystack retrieval: RULER's NIAH family (Hsieh et al. 2024, arXiv:2404.06654, Section 3.1).

A needle is the sentence "One of the special magic numbers for {key} is: {value}." (key: two English words
with a hyphen; value: a 7-digit number, or a UUID). Needles go in at sentence starts (between units in a
haystack of needles); a question asks for one key's value(s). RULER's templates and answer prefixes, in
the plural for the instruction and in the singular for a question about one value.

RULER's eight NIAH tasks, as its ``synthetic.yaml`` configures them (one question per haystack):

- ``niah_single_1``: one needle in the noise sentences; ``niah_single_2``: in real prose
  (:data:`~posenc.real.tasks.haystack.ESSAY_SOURCE`); ``niah_single_3``: in real prose, a UUID value;
- ``niah_multikey_1``: 4 needles of 4 keys in real prose, one of them asked (the others distract);
  ``niah_multikey_2``: one needle in a haystack made of needles of other word keys;
  ``niah_multikey_3``: the same with UUID keys and values;
- ``niah_multivalue``: one key with 4 values spread over real prose, all 4 asked;
- ``niah_multiquery``: 4 keys spread over real prose, one question asking all 4 values.

The many-needle variants ask several questions of one haystack, one needle each, so that one long
forward answers them all; each added needle is a distractor to the others, and scores fall with their
count (RULER's own ablation), so they are never the default evidence: ``niah_noise`` (niah_single_1's
haystack, a needle per question), ``niah_essay`` (niah_single_2's), ``niah_multikey`` (niah_multikey_3's),
and ``niah_multivalue`` / ``niah_multiquery`` asked with ``questions`` > 1.
"""

from __future__ import annotations

from .base import Ask, Layout
from .haystack import ItemFiller, TextFiller, essay_text, noise_text
from .text import Draw, Text

__all__ = [
    "NEEDLE",
    "niah_essay",
    "niah_multikey",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multiquery",
    "niah_multivalue",
    "niah_noise",
    "niah_single_3",
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
MULTIKEY_1_KEYS = 4  # niah_multikey_1's needles, one of them asked (RULER's num_needle_k)
# RULER's depths: 40 evenly spaced percentages of the haystack, from which its needles' depths are drawn
RULER_DEPTHS = tuple(round(100 * i / 39) / 100 for i in range(40))


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


def niah_single_3(draw: Draw, questions: int, length: int) -> Layout:
    """RULER's niah_single_3: a needle of a word key and a UUID value in real prose."""
    key, value = draw.key(), draw.uuid()
    needle = " " + _needle("uuids", key, value)
    ask = _ask("uuids", key, [value], 0)
    return Layout(Text.of(_INSTRUCTION, kind="uuids"), (ask,), TextFiller(essay_text), (needle,))


def niah_multikey_1(draw: Draw, questions: int, length: int) -> Layout:
    """RULER's niah_multikey_1: 4 needles of word keys and number values at distinct depths drawn from
    RULER's 40, in real prose; one of them, drawn, is asked."""
    keys = [draw.key() for _ in range(MULTIKEY_1_KEYS)]
    values = [draw.number(VALUE_DIGITS) for _ in keys]
    where = tuple(sorted(draw.rng.sample(RULER_DEPTHS, MULTIKEY_1_KEYS)))
    asked = draw.rng.randrange(MULTIKEY_1_KEYS)
    needles = tuple(" " + _needle("numbers", k, v) for k, v in zip(keys, values, strict=True))
    ask = _ask("numbers", keys[asked], [values[asked]], asked)
    return Layout(Text.of(_INSTRUCTION, kind="numbers"), (ask,), TextFiller(essay_text), needles, where)


def niah_multikey_2(draw: Draw, questions: int, length: int) -> Layout:
    """RULER's niah_multikey_2: one needle of a word key and a number value in a haystack made of needles
    of other word keys, a line each."""
    key, value = draw.key(), draw.number(VALUE_DIGITS)
    needle = _needle("numbers", key, value) + "\n"
    head = _needle("numbers", draw.key(), draw.number(VALUE_DIGITS)) + "\n"
    filler = ItemFiller(head, lambda: _needle("numbers", draw.key(), draw.number(VALUE_DIGITS)) + "\n")
    return Layout(
        Text.of(_INSTRUCTION, kind="numbers"), (_ask("numbers", key, [value], 0),), filler, (needle,)
    )


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
