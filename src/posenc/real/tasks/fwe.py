"""Frequent words extraction: RULER's second aggregation task (Hsieh et al. 2024, arXiv:2404.06654,
Section 3.3).

Coded words (six random lowercase letters) drawn with a Zipf distribution of exponent 2: the word of rank k
appears ``floor(N * k**-2 / zeta(2))`` times, shuffled, with N as large as the haystack holds; the word of
rank 1 is "..." (noise the question says to ignore), so the answer is the words of ranks 2 to 4. The
vocabulary has ``length // 50`` words (RULER's default; at least 10). N is never so small that rank 4 ties
rank 5 or leaves it out, so the three are always strictly the most frequent of at least four coded words.
"""

from __future__ import annotations

import math
import random
import string

from .base import Ask, Layout
from .haystack import Filler, pad_token
from .prompt import encode, encode_many
from .text import Draw, Text

__all__ = ["ALPHA", "TOP", "counts", "fwe", "least_words"]

ALPHA = 2.0
TOP = 3
_LETTERS = 6
_NOISE = "..."
_ZETA = math.pi**2 / 6  # zeta(ALPHA) for ALPHA = 2
_INSTRUCTION = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words."
)
_QUESTION = (
    "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
    "frequently appeared words in the above coded text?"
)
_ANSWER = " Answer: According to the coded text above, the three most frequently appeared words are:"


def counts(n: int, vocabulary: int) -> list[int]:
    """How often each of ``vocabulary`` words appears, by rank, for ``n`` draws (RULER's Zipf counts)."""
    return [math.floor(n * k**-ALPHA / _ZETA) for k in range(1, vocabulary + 1)]


def _valid(c: list[int]) -> bool:
    """The answer is unambiguous and not the only coded words: rank TOP + 2 appears, and ranks 2 to TOP + 1
    outnumber it."""
    return c[TOP + 1] >= 1 and c[TOP] > c[TOP + 1]


def least_words() -> int:
    """The smallest N whose counts make an unambiguous answer (whatever the vocabulary's size)."""
    return next(n for n in range(1, 10_000) if _valid(counts(n, TOP + 2)))


class _CodedText:
    """The coded text: ``vocabulary`` by rank (rank 1 the noise)."""

    def __init__(self, vocabulary: list[str], rng: random.Random):
        self.vocabulary, self.rng = vocabulary, rng

    def fewest(self, tokenizer) -> int:
        c = counts(least_words(), len(self.vocabulary))
        word = Text.of(" {w}", w=Text.drawn("", _LETTERS)).bound(len(encode(tokenizer, " ")))
        return c[0] * len(encode(tokenizer, " " + _NOISE)) + sum(c[1:]) * word

    def build(self, tokenizer, room: int) -> Filler:
        ids = encode_many(tokenizer, [" " + w for w in self.vocabulary])
        size = [len(x) for x in ids]

        def total(n: int) -> int:
            return sum(c * s for c, s in zip(counts(n, len(size)), size, strict=True))

        lo, hi = least_words(), 2 * room + 2  # rank 1 alone is over half the words, each a token or more
        if total(lo) > room:
            raise ValueError(f"a coded text of {room} tokens cannot hold {lo} words")
        while lo < hi:  # the largest n that fits: total grows with n
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if total(mid) <= room else (lo, mid - 1)
        while not _valid(counts(lo, len(size))):
            lo -= 1
        words = [k for k, c in enumerate(counts(lo, len(size))) for _ in range(c)]
        self.rng.shuffle(words)
        out = [t for k in words for t in ids[k]]
        return Filler(out + [pad_token(tokenizer)] * (room - len(out)), [0])


def fwe(draw: Draw, questions: int, length: int) -> Layout:
    """One question: the three most frequent coded words of a text that fills the haystack."""
    size = max(length // 50, 10)
    vocabulary = [_NOISE] + [draw.letters(_LETTERS, string.ascii_lowercase).text for _ in range(size - 1)]
    ask = Ask(Text.plain(_QUESTION), Text.plain(_ANSWER), tuple(vocabulary[1 : TOP + 1]))
    return Layout(Text.plain(_INSTRUCTION), (ask,), _CodedText(vocabulary, draw.rng))
