"""Passkey retrieval, the easiest task: Mohtashami & Jaggi 2023, "Landmark Attention" (arXiv:2305.16300).

A five-digit key in their needle ("The pass key is 12345. Remember it. 12345 is the pass key.") hidden in
their repeated filler sentences, one key per haystack, asked once; the answer starts "The pass key is".
The same needle, filler and instruction as :mod:`posenc.real.passkey`'s teacher-forced prompts (which
import them from here), and the same key for a seed and trial index. Answers up to 16 tokens: the key and
the punctuation after it, with room to spare.
"""

from __future__ import annotations

from posenc.lab.passkey import PASSKEY_STYLES

from .base import Ask, Layout
from .haystack import TextFiller, noise_text
from .text import Draw, Text

__all__ = ["ANSWER_PREFIX", "INSTRUCTION", "KEY_DIGITS", "NEEDLE", "QUESTION", "passkey"]

KEY_DIGITS = 5
NEEDLE = PASSKEY_STYLES["sentences"][0].strip()
INSTRUCTION = (
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about it.\n\n"
)
QUESTION = "\n\nWhat is the pass key?"
ANSWER_PREFIX = " The pass key is"


def passkey(draw: Draw, questions: int, length: int) -> Layout:
    """One key in the noise sentences, one question."""
    key = draw.number(KEY_DIGITS)
    ask = Ask(Text.plain(QUESTION), Text.plain(ANSWER_PREFIX), (key.text,), 0)
    return Layout(Text.plain(INSTRUCTION), (ask,), TextFiller(noise_text), (Text.of(" " + NEEDLE, key=key),))
