"""The texts a task draws (keys, values, words) and what bounds their tokens whatever was drawn.

A :class:`Text` is a trial's text together with the same text without its drawn parts and the most
characters those parts can have: ``len(encode(fixed)) + most + 2 * parts`` bounds its tokens for every draw
(a token of a byte-level or character tokenizer covers at least one character of ASCII text; the 2 per part
allows for a merge at either edge), which is how :func:`posenc.real.tasks.min_length` knows the fewest
tokens a task needs before drawing anything.

Words come without downloads. :func:`english_words`: the lowercase words of 4 to 10 letters that the
Python documentation every CPython ships (``pydoc_data.topics``, PSF License) uses at least twice as prose
(about 1,500), sorted; past those, made-up words of three consonant-vowel syllables (``"bakemo"``), as
RULER (Hsieh et al. 2024, arXiv:2404.06654) takes English words first and other words when a haystack
needs more than it has.
"""

from __future__ import annotations

import functools
import random
import re
import string
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MAX_WORD", "Draw", "Text", "english_words", "made_up_word"]

MAX_WORD = 10  # letters of the longest English word; made-up words have 6
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


@dataclass(frozen=True)
class Text:
    """``text`` as the trial has it; ``fixed``: the same without its drawn parts; ``most``: the most
    characters the drawn parts can have; ``parts``: how many there are."""

    text: str
    fixed: str
    most: int = 0
    parts: int = 0

    @classmethod
    def plain(cls, text: str) -> Text:
        return cls(text, text)

    @classmethod
    def drawn(cls, text: str, most: int) -> Text:
        if len(text) > most:
            raise ValueError(f"a drawn text {text!r} is longer than its bound of {most} characters")
        return cls(text, "", most, 1)

    def __add__(self, other: Text | str) -> Text:
        other = other if isinstance(other, Text) else Text.plain(other)
        return Text(
            self.text + other.text, self.fixed + other.fixed, self.most + other.most, self.parts + other.parts
        )

    def __radd__(self, other: str) -> Text:
        return Text.plain(other) + self

    @classmethod
    def of(cls, template: str, **slots: Text | str) -> Text:
        """``template`` with its ``{name}`` fields filled from ``slots`` (plain strings count as fixed)."""
        out = Text.plain("")
        for literal, name, _, _ in string.Formatter().parse(template):
            out = out + literal
            if name is not None:
                out = out + slots[name]
        return out

    @classmethod
    def join(cls, sep: str, items: list[Text]) -> Text:
        out = Text.plain("")
        for i, item in enumerate(items):
            out = out + (sep if i else "") + item
        return out

    def bound(self, tokens_of_fixed: int) -> int:
        """The most tokens this text can take, given the tokens of its fixed part."""
        return tokens_of_fixed + self.most + 2 * self.parts


@functools.lru_cache(maxsize=1)
def english_words() -> tuple[str, ...]:
    """The lowercase words of 4 to :data:`MAX_WORD` letters that ``pydoc_data.topics`` (the language
    reference shipped with CPython; PSF License) uses at least twice as bare prose words, sorted; empty
    where the module is absent."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return ()
    text = " ".join(topics[key] for key in sorted(topics))
    # prose words only: a bare word (a trailing stop or comma allowed) seen twice, which leaves out code
    # names ("str.splitlines", '"shlex"', "funcname(") and the fragments of hyphenated words
    seen = Counter(m[1] for t in text.split() if (m := re.fullmatch(rf"([a-z]{{4,{MAX_WORD}}})[,.;:!?]?", t)))
    return tuple(sorted(word for word, n in seen.items() if n >= 2))


def made_up_word(rng: random.Random) -> str:
    """Three consonant-vowel syllables: a pronounceable word no dictionary needs to hold."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(3))


class Draw:
    """A trial's random strings, drawn from its own ``rng`` and never twice the same within the trial: each
    comes as a :class:`Text` that knows its widest possible form."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self._seen: set[str] = set()

    def _fresh(self, make, most: int) -> Text:
        while True:
            text = make()
            if text not in self._seen:
                self._seen.add(text)
                return Text.drawn(text, most)

    def number(self, digits: int) -> Text:
        """A number of exactly ``digits`` digits (no leading zero)."""
        return self._fresh(lambda: str(self.rng.randint(10 ** (digits - 1), 10**digits - 1)), digits)

    def uuid(self) -> Text:
        """A random version-4 UUID (36 characters)."""
        return self._fresh(lambda: str(uuid.UUID(int=self.rng.getrandbits(128), version=4)), 36)

    def key(self) -> Text:
        """Two English words joined by a hyphen (RULER's keys are adjective-noun pairs)."""
        words = english_words() or tuple(made_up_word(random.Random(i)) for i in range(64))
        return self._fresh(lambda: "-".join(self.rng.sample(words, 2)), 2 * MAX_WORD + 1)

    def letters(self, count: int, alphabet: str = string.ascii_uppercase) -> Text:
        """``count`` letters of ``alphabet`` (RULER's variable names: five capitals)."""
        return self._fresh(lambda: "".join(self.rng.choices(alphabet, k=count)), count)

    def words(self) -> Iterator[Text]:
        """Distinct words without end: the English words in a random order, then made-up ones."""
        english = english_words()
        for word in self.rng.sample(english, len(english)):
            if word not in self._seen:
                self._seen.add(word)
                yield Text.drawn(word, MAX_WORD)
        while True:
            yield self._fresh(lambda: made_up_word(self.rng), MAX_WORD)
