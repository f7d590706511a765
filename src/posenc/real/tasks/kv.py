"""Key-value retrieval: Liu et al. 2023, "Lost in the Middle: How Language Models Use Long Contexts"
(arXiv:2307.03172, Section 4).

A JSON object of random UUID keys and UUID values, laid out as theirs (``{"key": "value",`` then a line
per pair), fills the haystack; the asked pairs sit at evenly spaced depths among the others and each
question gives a key and asks for its value ("Key: ..." / "Corresponding value:", their prompt). The
object always parses: whole pairs only, whitespace before the last pair where another no longer fits.
Answers up to 100 tokens (their scripts' default).
"""

from __future__ import annotations

from .base import Ask, Layout
from .haystack import ItemFiller
from .text import Draw, Text

__all__ = ["kv"]

_INSTRUCTION = (
    "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n"
)
_QUESTION = '\n\nKey: "{key}"'
_ANSWER = "\nCorresponding value:"
_FIRST = '{{"{key}": "{value}",\n'  # the object's opening brace and first pair
_PAIR = ' "{key}": "{value}",\n'  # each pair ends with its separator: see ItemFiller
_LAST = ' "{key}": "{value}"}}'


def kv(draw: Draw, questions: int, length: int) -> Layout:
    """``questions`` asked pairs among pairs of other keys that fill the object."""
    keys = [draw.uuid() for _ in range(questions)]
    values = [draw.uuid() for _ in range(questions)]
    needles = tuple(Text.of(_PAIR, key=k, value=v) for k, v in zip(keys, values, strict=True))
    asks = tuple(
        Ask(Text.of(_QUESTION, key=k), Text.plain(_ANSWER), (v.text,), i)
        for i, (k, v) in enumerate(zip(keys, values, strict=True))
    )
    head = Text.of(_FIRST, key=draw.uuid(), value=draw.uuid())
    tail = Text.of(_LAST, key=draw.uuid(), value=draw.uuid())
    filler = ItemFiller(head, lambda: Text.of(_PAIR, key=draw.uuid(), value=draw.uuid()), tail)
    return Layout(Text.plain(_INSTRUCTION), asks, filler, needles)
