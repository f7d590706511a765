"""Haystacks of an exact number of tokens, and the token indices where a needle may go in.

Two kinds of filler make them. Text (:class:`TextFiller`): the noise sentences of Mohtashami & Jaggi
(arXiv:2305.16300, RULER's "noise" haystack) or real prose (:func:`essay_text`), tokenized as one text and
cut at the exact token count; a needle goes in where a sentence starts (after ". ", before a capital), found
through the tokenizer's offset mapping. Items (:class:`ItemFiller`): whole units (a needle-like sentence, a
JSON pair) tokenized one at a time; the gap the last whole unit leaves, fewer tokens than one unit, is filled
with whitespace tokens (:func:`pad_token`) so that a JSON object still parses and no unit is cut (those few
tokens are the only ones the whole decoded text would tokenize otherwise).

The real-text haystack is :data:`ESSAY_SOURCE`: text every CPython installs, so nothing is downloaded
(RULER's own, Paul Graham's essays, is fetched from the web).
"""

from __future__ import annotations

import ast
import re
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from posenc.lab.passkey import REPEAT_FILLER

from .prompt import encode
from .text import Text

__all__ = [
    "ESSAY_SOURCE",
    "Filler",
    "ItemFiller",
    "TextFiller",
    "essay_text",
    "noise_text",
    "pad_token",
    "sentence_starts",
    "text_filler",
]

ESSAY_SOURCE = (
    "the Python Language Reference's topic texts shipped with CPython (pydoc_data.topics, in sorted-key "
    "order), then the docstrings of the standard library's modules (read with ast, files sorted by path); "
    "headings' underlines dropped, whitespace runs made single spaces. Copyright Python Software "
    "Foundation, PSF License Version 2"
)


@dataclass(frozen=True)
class Filler:
    """A haystack's filler: ``ids`` (exactly the asked number of tokens) and ``starts``, the sorted token
    indices (at most ``len(ids)``) where a needle may go in."""

    ids: list[int]
    starts: list[int]


def _collapse(text: str) -> str:
    """``text`` on one line: without the lines of a heading's underline ("*****"), whitespace runs single
    spaces (as RULER does to its essays)."""
    text = re.sub(r"^\s*([*=~^#-])\1{3,}\s*$", "", text, flags=re.M)
    return re.sub(r"\s+", " ", text).strip()


def _docstrings() -> Iterator[str]:
    """The standard library's docstrings, files sorted by path, each file's in ``ast.walk`` order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if {"site-packages", "dist-packages"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):  # test data that is not Python 3
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc.strip():
                    yield _collapse(doc)


class _Essay:
    """:data:`ESSAY_SOURCE` read as far as asked: the docstrings (seconds to parse them all) only when a
    haystack needs more than the topic texts' ~465K characters."""

    def __init__(self):
        self.text = ""
        self._rest: Iterator[str] | None = None
        self._done = False

    def read(self, chars: int) -> str:
        if self._rest is None:
            try:
                from pydoc_data.topics import topics
            except ImportError:
                topics = {}
            self.text = " ".join(_collapse(topics[key]) for key in sorted(topics))
            self._rest = _docstrings()
        parts = [self.text] if self.text else []
        size = len(self.text)
        while size < chars and not self._done:
            doc = next(self._rest, None)
            if doc is None:
                self._done = True
                break
            parts.append(doc)
            size += len(doc) + 1
        self.text = " ".join(parts)
        if len(self.text) >= chars or not self.text:
            return self.text[:chars]
        return ((self.text + " ") * (chars // len(self.text) + 1))[:chars]  # all read: start again


_ESSAY = _Essay()


def essay_text(chars: int) -> str:
    """The first ``chars`` characters of :data:`ESSAY_SOURCE` (repeated, were it ever all read)."""
    return _ESSAY.read(chars)


def noise_text(chars: int) -> str:
    """At least ``chars`` characters of the noise sentences ("The grass is green. The sky is blue. ...")."""
    return REPEAT_FILLER * (chars // len(REPEAT_FILLER) + 1)


def sentence_starts(text: str) -> list[int]:
    """The character indices where a sentence of ``text`` starts: 0, and every capital after ". "."""
    return [0] + [m.end() for m in re.finditer(r"\. (?=[A-Z])", text)]


def text_filler(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """The tokens of ``text`` and the indices of the tokens that start a sentence (the token that holds the
    space before it, GPT-2-style BPE, or else the one that starts at its capital); just [0] for a tokenizer
    that cannot map tokens to characters."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, KeyError, TypeError, ValueError):  # a slow (Python) tokenizer
        return encode(tokenizer, text), [0]
    token_at = {a: t for t, (a, _) in reversed(list(enumerate(offsets)))}  # first token starting at a char
    starts = []
    for i in sentence_starts(text):
        t = token_at.get(i - 1, token_at.get(i)) if i else token_at.get(0)
        if t is not None:
            starts.append(t)
    return list(enc["input_ids"]), starts


class TextFiller:
    """A filler of running text: ``source(chars)`` gives at least that many characters of it. Needles go in
    at sentence starts after the first (so that a needle follows a whole sentence); where none is left,
    at the end."""

    def __init__(self, source: Callable[[int], str]):
        self.source = source

    def build(self, tokenizer, room: int) -> Filler:
        chars = 6 * room + 200  # prose takes about 4 characters a token; too few is read again, doubled
        while True:
            ids, starts = text_filler(tokenizer, self.source(chars))
            if len(ids) > room:
                break
            chars *= 2
        cut = [s for s in starts if 0 < s <= room]
        return Filler(ids[:room], cut or [room])

    def fewest(self, tokenizer) -> int:
        """Running text can be cut anywhere: it needs no room."""
        return 0


def pad_token(tokenizer) -> int:
    """A token that is whitespace alone (a space, else a line break): what fills a gap too small for a
    whole unit."""
    for text in (" ", "\n", "  "):
        ids = encode(tokenizer, text)
        if len(ids) == 1 and not tokenizer.decode(ids).strip():
            return ids[0]
    raise ValueError("this tokenizer has no token of whitespace alone to fill a haystack to its length")


class ItemFiller:
    """A filler of whole units: ``head`` (a first unit, drawn before the trial's needles), then units from
    ``item()`` while they fit, whitespace tokens, and ``tail`` (text that closes the haystack, e.g. a JSON
    object's last pair and brace). Needles go in between units, after the head.

    Units end with their separator (",\\n", "\\n"), so that each starts where a byte-level BPE splits the
    text anyway: tokenized one at a time, they are the tokens the whole text would have.
    """

    def __init__(self, head: Text, item: Callable[[], Text], tail: Text | None = None):
        self.head, self.item, self.tail = head, item, tail or Text.plain("")

    def fewest(self, tokenizer) -> int:
        """The most tokens the head and the tail can take: the least room this filler needs."""
        return sum(t.bound(len(encode(tokenizer, t.fixed))) for t in (self.head, self.tail))

    def build(self, tokenizer, room: int) -> Filler:
        tail = encode(tokenizer, self.tail.text) if self.tail.text else []
        ids = encode(tokenizer, self.head.text)
        if len(ids) + len(tail) > room:
            raise ValueError(f"a haystack of {room} tokens cannot hold its first and last units")
        starts = [len(ids)]
        while True:
            unit = encode(tokenizer, self.item().text)
            if len(ids) + len(unit) + len(tail) > room:
                break
            ids += unit
            starts.append(len(ids))
        ids += [pad_token(tokenizer)] * (room - len(ids) - len(tail)) + tail
        return Filler(ids, starts)
