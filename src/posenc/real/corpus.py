"""The text ``posenc extend`` scores: long documents in the model's tokens, and windows that end alike.

A window of length L is the L tokens that end at one chosen token of one document. The ends are chosen
once, for the longest length, and every shorter length takes the same ends: so each length scores the
same final tokens, with more or less of the document before them as context, and a row reads as "these
tokens, with this much context". Windows stay inside one document (the largest files first, one window
each from its end, then further windows further back), so the context before a token is the text that
really came before it.

The default corpus is the laboratory's, the Python standard library of the running interpreter
(:func:`posenc.lab.data.default_corpus`): text every machine has, in files long enough for 16K- and 32K-token
windows (the longest is the library's documentation, ``pydoc_data/topics.py``). A pretrained model may
have read these files; comparisons between methods on the same tokens stay fair.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc.lab.data import check_corpus_path, default_corpus, list_files

__all__ = [
    "Document",
    "Window",
    "check_corpus",
    "choose_windows",
    "ids_digest",
    "load_documents",
    "window_ids",
]


@dataclass(frozen=True)
class Document:
    """A document's ``name`` (its path relative to the corpus) and ``tokens`` (1-D int64 array)."""

    name: str
    tokens: np.ndarray


@dataclass(frozen=True)
class Window:
    """Where a window ends: ``document`` (an index into the document list) and ``end`` (exclusive)."""

    document: int
    end: int


def check_corpus(corpus: str | os.PathLike | None) -> tuple[Path, list[Path]]:
    """The root and the text files of ``corpus`` (see :func:`load_documents`); a ValueError naming
    ``--corpus`` and the path, before any tokenizing, when it does not exist, cannot be read, is a binary
    file, or is a folder without text files."""
    root = check_corpus_path(corpus if corpus is not None else default_corpus(), "--corpus")
    if root.is_file():
        return root, [root]
    try:
        files = list_files(root, "*.py" if corpus is None else None)
    except OSError as e:
        raise ValueError(f"--corpus {str(root)!r}: cannot read {e.filename or root}: {e.strerror}") from None
    if not files:
        raise ValueError(
            f"--corpus {str(root)!r} is a folder without text files; give a folder of text files"
        )
    return root, files


def load_documents(
    corpus: str | os.PathLike | None, tokenizer, min_tokens: int, enough: int | None = None
) -> list[Document]:
    """Documents of ``corpus`` (a text file, or a folder whose text files are documents; default: the
    standard library's ``*.py`` files) with at least ``min_tokens`` tokens, largest file first (ties by
    name); at most ``enough`` of them.

    Files are tokenized in that order until ``enough`` are found; a file shorter than ``min_tokens`` bytes
    cannot hold that many tokens and is never tokenized. Raises ValueError naming ``--corpus`` when it cannot
    be read (:func:`check_corpus`) or no document is long enough.
    """
    root, files = check_corpus(corpus)
    sized = sorted(((f.stat().st_size, f) for f in files), key=lambda sf: (-sf[0], sf[1].as_posix()))
    docs, longest = [], 0
    for size, path in sized:
        if size < min_tokens or (enough is not None and len(docs) >= enough):
            break
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise ValueError(f"--corpus {str(root)!r}: cannot read {str(path)!r}: {e.strerror}") from None
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        longest = max(longest, len(ids))
        if len(ids) >= min_tokens:
            name = path.name if path == root else path.relative_to(root).as_posix()
            docs.append(Document(name, ids))
    if not docs:
        if longest:
            largest = f"the longest has {longest} tokens"
        else:
            largest = f"the largest file has {sized[0][0]} bytes" if sized else "it has no text files"
        raise ValueError(
            f"--corpus {str(root)!r}: no document has the {min_tokens} tokens the longest length needs "
            f"({largest}); use shorter --lengths or a corpus with longer texts"
        )
    return docs


def choose_windows(docs: list[Document], count: int, need: int, tail: int) -> list[Window]:
    """``count`` windows of ``need`` tokens: one from each document in turn, ending at its end; when every
    document has one, a second round ends each ``tail`` tokens earlier, and so on, so that no two windows
    score a token twice. Raises ValueError when the documents cannot hold ``count`` windows."""
    windows: list[Window] = []
    back = 0
    while len(windows) < count:
        added = False
        for i, doc in enumerate(docs):
            end = len(doc.tokens) - back
            if end >= need and len(windows) < count:
                windows.append(Window(i, end))
                added = True
        if not added:
            raise ValueError(
                f"--windows {count}: the corpus holds only {len(windows)} windows of {need} tokens whose "
                f"last {tail} tokens do not overlap; use fewer --windows or a longer corpus"
            )
        back += tail
    return windows


def window_ids(doc: Document, window: Window, length: int, start: list[int]) -> list[int]:
    """The ``length`` token ids of ``window``: the tokenizer's ``start`` tokens (a BOS), then the document's
    tokens that end at the window's end."""
    body = length - len(start)
    return start + doc.tokens[window.end - body : window.end].tolist()


def ids_digest(ids) -> str:
    """A short digest of a token sequence: what identifies a scored input in a cache."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:20]
