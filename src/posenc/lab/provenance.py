"""How to reproduce a laboratory run: versions, git revision, device, settings and a corpus fingerprint.

``posenc compare`` stores :func:`provenance` under ``"provenance"`` in results.json. The corpus is
identified by what the models actually read, its token arrays: their sizes and the SHA-256 of their
bytes (the whole split up to :data:`HASH_ALL_BELOW` bytes, beyond that its first and last
:data:`HASH_EDGE` bytes, so a multi-GB corpus is fingerprinted in a moment).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from posenc.lab.data import Corpus
from posenc.runs.provenance import environment

__all__ = ["HASH_ALL_BELOW", "HASH_EDGE", "corpus_fingerprint", "provenance"]

HASH_ALL_BELOW = 64 << 20
HASH_EDGE = 32 << 20


def _split_fingerprint(tokens: np.ndarray) -> dict:
    data = memoryview(np.ascontiguousarray(tokens, dtype=np.uint8)).cast("B")
    h = hashlib.sha256()
    if len(data) <= HASH_ALL_BELOW:
        h.update(data)
        hashed = "all"
    else:
        h.update(data[:HASH_EDGE])
        h.update(data[-HASH_EDGE:])
        hashed = f"first and last {HASH_EDGE} bytes"
    return {"tokens": len(data), "sha256": h.hexdigest(), "hashed": hashed}


def corpus_fingerprint(corpus: Corpus) -> dict:
    """``{"path", "train": {"tokens", "sha256", "hashed"}, "val": {...}}`` of a loaded corpus."""
    return {
        "path": str(Path(corpus.path).resolve()),
        "train": _split_fingerprint(corpus.train),
        "val": _split_fingerprint(corpus.val),
    }


def provenance(settings_json: dict, corpus: Corpus, device: str) -> dict:
    """Everything needed to rerun a comparison and to tell whether a rerun saw the same inputs."""
    return {**environment(device), "settings": settings_json, "corpus": corpus_fingerprint(corpus)}
