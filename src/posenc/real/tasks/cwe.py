"""Common words extraction: RULER's aggregation task (Hsieh et al. 2024, arXiv:2404.06654, Section 3.3).

A numbered list of words ("1. word 2. word ...") in which 10 common words each appear ``freq_cw`` times
and every other word ``freq_ucw`` times, shuffled; the question asks for the 10 most common. RULER's counts
are 30 and 3; where the list would then be more common words than uncommon ones, the task takes the next of
(6, 1) (RULER's below 4096 tokens), (3, 1), (2, 1): the common words always strictly the more frequent, the
uncommon ones the bulk of the list. As in RULER, a solved example comes first (20 words seen 3 and 1 times
below 4096 tokens, 40 words seen 10 and 3 times from 4096). Words: :meth:`~posenc.real.tasks.text.Draw.words`
(English words of the Python documentation, then made-up ones), each tokenized alone with its number, so
that the list's tokens are counted exactly.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from .base import Ask, Layout
from .haystack import Filler, pad_token
from .prompt import encode, encode_many
from .text import MAX_WORD, Draw, Text

__all__ = ["COMMON", "SCHEDULES", "cwe"]

COMMON = 10
SCHEDULES = ((30, 3), (6, 1), (3, 1), (2, 1))  # (freq_cw, freq_ucw), RULER's first
_LONG = 4096  # RULER's switch to its longer example
_INSTRUCTION = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n"
)
_QUESTION = "\nQuestion: What are the 10 most common words in the above list?"
_ANSWER = " Answer: The top 10 words that appear most often in the list are:"


def _number(i: int) -> str:
    """The number before the ``i``-th word (from 1): the first follows a line break, the others a word."""
    return f"{i}." if i == 1 else f" {i}."


def _numbered(words: list[Text]) -> Text:
    return Text.join("", [_number(i + 1) + Text.of(" {w}", w=w) for i, w in enumerate(words)])


def _example(words: Iterator[Text], rng: random.Random, length: int) -> Text:
    """A solved example: a short list of RULER's counts, the question and the answer."""
    count, freq_cw, freq_ucw = (40, 10, 3) if length >= _LONG else (20, 3, 1)
    chosen = list(itertools.islice(words, count))
    listed = chosen[:COMMON] * freq_cw + chosen[COMMON:] * freq_ucw
    rng.shuffle(listed)
    return _INSTRUCTION + _numbered(listed) + _QUESTION + _ANSWER + " " + _numbered(chosen[:COMMON]) + "\n"


class _Lazy:
    """The tokens of an endless sequence of texts, encoded a chunk at a time as far as they are read."""

    def __init__(self, tokenizer, texts: Iterator[str]):
        self.tokenizer, self.texts, self.ids = tokenizer, texts, []

    def __getitem__(self, i: int) -> list[int]:
        while i >= len(self.ids):
            chunk = list(itertools.islice(self.texts, max(256, len(self.ids))))
            self.ids += encode_many(self.tokenizer, chunk)
        return self.ids[i]


class _WordList:
    """The numbered list: ``common`` words and as many of ``uncommon`` as fill the room."""

    def __init__(self, common: list[Text], uncommon: Iterator[Text], rng: random.Random):
        self.common, self.uncommon, self.rng = common, uncommon, rng

    def fewest(self, tokenizer) -> int:
        """The most tokens the smallest list can take: the last schedule, as many uncommon words as
        common."""
        freq_cw, freq_ucw = SCHEDULES[-1]
        items = COMMON * (freq_cw + freq_ucw)
        word = Text.of(" {w}", w=Text.drawn("", MAX_WORD)).bound(len(encode(tokenizer, " ")))
        numbers = encode_many(tokenizer, [_number(i) for i in range(1, items + 1)])
        return sum(map(len, numbers)) + items * word

    @staticmethod
    def _most(numbers: _Lazy, common: int, uncommon: _Lazy, schedule, room: int) -> int:
        """The most uncommon words a list of ``schedule``'s counts holds in ``room`` tokens (-1: none)."""
        freq_cw, freq_ucw = schedule
        items = COMMON * freq_cw
        total = sum(len(numbers[i]) for i in range(items)) + freq_cw * common
        if total > room:
            return -1
        n = 0
        while True:
            total += freq_ucw * len(uncommon[n]) + sum(len(numbers[items + j]) for j in range(freq_ucw))
            if total > room:
                return n
            items, n = items + freq_ucw, n + 1

    def build(self, tokenizer, room: int) -> Filler:
        numbers = _Lazy(tokenizer, (_number(i) for i in itertools.count(1)))
        common_ids = encode_many(tokenizer, [" " + w.text for w in self.common])
        uncommon = _Lazy(tokenizer, (" " + w.text for w in self.uncommon))
        for schedule in SCHEDULES:
            n = self._most(numbers, sum(map(len, common_ids)), uncommon, schedule, room)
            if n * schedule[1] >= COMMON * schedule[0] or (schedule == SCHEDULES[-1] and n >= COMMON):
                break
        else:
            raise ValueError(f"a word list of {room} tokens cannot hold {COMMON} common words")
        freq_cw, freq_ucw = schedule
        listed = [common_ids[c] for c in range(COMMON)] * freq_cw + [uncommon[u] for u in range(n)] * freq_ucw
        self.rng.shuffle(listed)
        ids = [t for i, word in enumerate(listed) for t in numbers[i] + word]
        return Filler(ids + [pad_token(tokenizer)] * (room - len(ids)), [0])


def cwe(draw: Draw, questions: int, length: int) -> Layout:
    """One question: the 10 common words of a list that fills the haystack."""
    words = draw.words()
    example = _example(words, draw.rng, length)
    common = list(itertools.islice(words, COMMON))
    ask = Ask(Text.plain(_QUESTION), Text.plain(_ANSWER), tuple(w.text for w in common))
    return Layout(example + _INSTRUCTION, (ask,), _WordList(common, words, draw.rng))
