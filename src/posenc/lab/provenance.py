"""How to reproduce a laboratory run: versions, git revision, device, settings and a corpus fingerprint.

``posenc compare`` stores :func:`provenance` under ``"provenance"`` in results.json. The corpus is
identified by what the models actually read, its token arrays: their sizes and the SHA-256 of their
bytes (the whole split up to :data:`HASH_ALL_BELOW` bytes, beyond that its first and last
:data:`HASH_EDGE` bytes, so a multi-GB corpus is fingerprinted in a moment).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import posenc
from posenc.lab.data import Corpus

__all__ = ["HASH_ALL_BELOW", "HASH_EDGE", "corpus_fingerprint", "environment", "git_revision", "provenance"]

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


def git_revision(path: str | Path | None = None) -> dict | None:
    """``{"commit", "dirty"}`` of the git checkout holding ``path`` (default: posenc's own source), or None
    when it is not in a checkout (an installed wheel) or git is not available."""
    where = Path(path) if path is not None else Path(posenc.__file__).resolve().parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # Uncommitted changes to tracked files mean the commit alone does not reproduce the run.
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def _device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """The software and machine a run used: versions, git revision, platform, device, CPU count, command."""
    return {
        "posenc": posenc.__version__,
        "git": git_revision(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": device,
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
        "command": sys.argv,
    }


def provenance(settings_json: dict, corpus: Corpus, device: str) -> dict:
    """Everything needed to rerun a comparison and to tell whether a rerun saw the same inputs."""
    return {**environment(device), "settings": settings_json, "corpus": corpus_fingerprint(corpus)}
