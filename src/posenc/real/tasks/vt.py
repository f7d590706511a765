"""Variable tracking: RULER's multi-hop tracing task (Hsieh et al. 2024, arXiv:2404.06654, Section 3.2).

A chain "VAR ABCDE = 12345. VAR FGHIJ = VAR ABCDE. ..." (a 5-digit value, 4 hops, five-capital names, as
RULER's vt) is hidden statement by statement in the noise sentences; the question asks for every variable
that holds the value, which only following each hop answers. A trial holds one chain per question, with
distinct values (RULER's vt: one chain, one question; more questions make a many-chain variant); the
chains' statements go in at evenly spaced depths, interleaved at random with each
chain's statements in order (as RULER interleaves them). As in RULER, a solved example with a short chain
comes first (its value and names drawn like the rest).
"""

from __future__ import annotations

from posenc.lab.passkey import REPEAT_FILLER

from .base import Ask, Layout
from .haystack import TextFiller, noise_text
from .text import Draw, Text

__all__ = ["HOPS", "vt"]

HOPS = 4
_VALUE_DIGITS = 5
_NAME_LETTERS = 5
_INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
_QUESTION = "\nQuestion: Find all variables that are assigned the value {value} in the text above."
_ANSWER = (
    " Answer: According to the chain(s) of variable assignment in the text above, {count} variables are "
    "assigned the value {value}, they are:"
)


def _chain(draw: Draw) -> tuple[Text, list[Text], list[Text]]:
    """A chain's value, its variables' names and its statements (value first, then a hop each)."""
    value = draw.number(_VALUE_DIGITS)
    names = [draw.letters(_NAME_LETTERS) for _ in range(HOPS + 1)]
    statements = [Text.of("VAR {a} = {v}.", a=names[0], v=value)]
    statements += [
        Text.of("VAR {b} = VAR {a}.", b=b, a=a) for a, b in zip(names[:-1], names[1:], strict=True)
    ]
    return value, names, statements


def _ask(value: Text, names: list[Text], needle: int | None) -> Ask:
    answer = Text.of(_ANSWER, count=str(len(names)), value=value)
    return Ask(Text.of(_QUESTION, value=value), answer, tuple(n.text for n in names), needle, separator=" ")


def _example(draw: Draw) -> Text:
    """A solved example: a chain among a few noise sentences, the question and its answer."""
    value, names, statements = _chain(draw)
    noise = REPEAT_FILLER.strip()
    context = Text.plain(noise)
    for statement in statements:
        context = context + " " + statement + " " + noise
    ask = _ask(value, names, None)
    answer = Text.join(" ", names)
    return Text.plain(_INSTRUCTION) + context + ask.question + ask.answer_prefix + " " + answer + "\n\n"


def vt(draw: Draw, questions: int, length: int) -> Layout:
    """``questions`` chains in the noise sentences, a question for each."""
    example = _example(draw)
    chains = [_chain(draw) for _ in range(questions)]
    order = [c for c in range(questions) for _ in range(HOPS + 1)]
    draw.rng.shuffle(order)  # which chain each slot's statement comes from, each chain's in order
    needles, first, taken = [], {}, [0] * questions
    for c in order:
        first.setdefault(c, len(needles))
        needles.append(" " + chains[c][2][taken[c]])
        taken[c] += 1
    asks = tuple(_ask(value, names, first[c]) for c, (value, names, _) in enumerate(chains))
    return Layout(example + _INSTRUCTION, asks, TextFiller(noise_text), tuple(needles))
