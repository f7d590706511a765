"""Byte-level corpora for the laboratory: find the files, split by file, cache tokens as memory maps.

The default corpus is the Python standard library of the running interpreter, so the laboratory
needs no download: every machine with Python has ~10 MB of varied, real text. Tokens are raw bytes
(vocabulary 256), so there is no tokenizer to train or ship.

Split: a file goes to validation when a hash of its path relative to the corpus root falls in the
lowest ``val_percent`` of 100 buckets. The split is therefore the same on every machine and every run,
and no file contributes to both sides (windows of one file look alike; a token-level split would
leak). A single-file corpus cannot be split by file; its last ``val_percent`` of bytes is validation.

Cache: the concatenated tokens are written once as ``train.npy`` / ``val.npy`` (uint8) under a
directory keyed by the corpus path, the file list, sizes and mtimes, and opened with
``np.load(mmap_mode="r")`` afterwards, so repeated runs start instantly and several processes
(DDP ranks) share the pages.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from posenc.lab.errors import CorpusError
from posenc.lab.mix import mix_rows
from posenc.lab.passkey import passkey_rows

# Bumped when the token format or the split rule changes, so stale caches are not reused.
_CACHE_VERSION = 1
# A file separator token between files: a NUL byte never occurs in text, so the model learns
# "a new file starts here" from it rather than from a run-on of two unrelated files.
_FILE_SEPARATOR = b"\x00"
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", ".git"}


def default_corpus() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/posenc/tokens`` or ``~/.cache/posenc/tokens``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "posenc" / "tokens"


def _is_test_path(rel: Path) -> bool:
    if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
        return True
    name = rel.name
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\x00" in f.read(8192)


def list_files(root: Path, pattern: str | None = None) -> list[Path]:
    """Files of a corpus folder, sorted by relative path (so token order is the same everywhere).

    Test folders and test files, hidden folders, ``site-packages`` and binary files (a NUL byte in
    the first 8 KiB) are left out. ``pattern`` is an fnmatch pattern on the file name (``"*.py"``).
    """
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            path = Path(dirpath) / name
            if pattern is not None and not fnmatch.fnmatch(name, pattern):
                continue
            if _is_test_path(path.relative_to(root)) or not path.is_file() or path.is_symlink():
                continue
            if pattern is None and _looks_binary(path):
                continue
            files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_validation_file(relative_path: str, val_percent: float) -> bool:
    """Whether a file (path relative to the corpus root, POSIX separators) belongs to validation."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:8], "big") % 10_000
    return bucket < val_percent * 100


@dataclass
class Corpus:
    """Tokens of one corpus. ``train`` and ``val`` are 1-D uint8 arrays (memory maps when cached)."""

    path: str
    train: np.ndarray
    val: np.ndarray


def _corpus_key(root: Path, files: list[Path], val_percent: float, pattern: str | None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([_CACHE_VERSION, str(root.resolve()), val_percent, pattern]).encode())
    for f in files:
        st = f.stat()
        rel = f.name if f == root else f.relative_to(root).as_posix()
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        # mkstemp makes the file 0600; a token cache holds public text and may be shared (a group's
        # cache directory, DDP ranks under other users), so it gets the mode any new file would get.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _join(files: list[Path]) -> np.ndarray:
    return np.frombuffer(b"".join(f.read_bytes() + _FILE_SEPARATOR for f in files), dtype=np.uint8)


def _tokenize(root: Path, files: list[Path], val_percent: float) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation tokens: split by file (see the module docstring), or a single file's tail."""
    if root.is_file():
        data = np.frombuffer(root.read_bytes(), dtype=np.uint8)
        n_val = int(round(len(data) * val_percent / 100))
        return data[: len(data) - n_val].copy(), data[len(data) - n_val :].copy()
    rels = {f: f.relative_to(root).as_posix() for f in files}
    val = {f for f in files if is_validation_file(rels[f], val_percent)}
    if not val and len(files) > 1:
        # Too few files for the hash to pick any: the file whose hash is lowest goes to validation,
        # which keeps the split by file and deterministic.
        val = {min(files, key=lambda f: hashlib.sha256(rels[f].encode()).digest())}
    return _join([f for f in files if f not in val]), _join([f for f in files if f in val])


def _cached_tokens(
    root: Path, files: list[Path], val_percent: float, pattern: str | None, cache_dir
) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation tokens as memory maps, tokenizing into the cache first when needed."""
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = cache_root / _corpus_key(root, files, val_percent, pattern)
    train_path, val_path = entry / "train.npy", entry / "val.npy"
    if not (train_path.exists() and val_path.exists()):
        train, val = _tokenize(root, files, val_percent)
        entry.mkdir(parents=True, exist_ok=True)
        _save_npy_atomic(train_path, train)
        _save_npy_atomic(val_path, val)
        (entry / "source.json").write_text(json.dumps({"corpus": str(root), "files": len(files)}))
    return np.load(train_path, mmap_mode="r"), np.load(val_path, mmap_mode="r")


def check_corpus_path(path: str | os.PathLike, name: str = "corpus") -> Path:
    """``path`` when it is a readable text file or a readable folder (what :func:`load_corpus` reads);
    else a :class:`CorpusError` naming it as ``name`` (a command's flag). Cheap: the commands call it
    before any work."""
    root, said = Path(path).expanduser(), f"{name} {str(Path(path).expanduser())!r}"
    if not root.exists():
        raise CorpusError(f"{said} does not exist; give a text file or a folder of text files")
    if not root.is_file() and not root.is_dir():
        raise CorpusError(f"{said} is neither a file nor a folder; give a text file or a folder")
    if not os.access(root, os.R_OK | (os.X_OK if root.is_dir() else 0)):
        raise CorpusError(f"{said} is not readable (permission denied)")
    try:
        binary = root.is_file() and _looks_binary(root)  # the rule list_files applies to a folder's files
    except OSError as e:
        raise CorpusError(f"{said} cannot be read: {e.strerror or e}") from None
    if binary:
        raise CorpusError(
            f"{said} is a binary file (a NUL byte in its first 8 KiB); give a text file or a folder of "
            "text files"
        )
    return root


def load_corpus(
    path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    val_percent: float = 5.0,
    pattern: str | None = None,
    min_train_tokens: int = 1,
    min_val_tokens: int = 1,
) -> Corpus:
    """Tokens of a corpus, from the cache when the corpus has not changed.

    Args:
        path: a text file or a folder; ``None`` is the standard library (``*.py`` files).
        cache_dir: where token caches live (default :func:`default_cache_dir`).
        val_percent: share of files (percent, 0 < p < 100) that go to validation.
        pattern: fnmatch pattern for file names in a folder; ``None`` takes every text file.
        min_train_tokens, min_val_tokens: the least each split must hold for the caller's lengths.

    Raises:
        CorpusError: the path does not exist, holds no text, or is smaller than the minimum.
    """
    if not 0 < val_percent < 100:
        raise CorpusError(f"val_percent={val_percent!r} is out of range; allowed: 0 < val_percent < 100")
    if path is None:
        root, pattern = default_corpus(), pattern or "*.py"
    else:
        root = check_corpus_path(path)
    files = [root] if root.is_file() else list_files(root, pattern)
    if not files:
        what = f"files matching {pattern!r}" if pattern else "text files"
        raise CorpusError(f"corpus {str(root)!r} holds no {what} (test folders and binary files are skipped)")
    train, val = _cached_tokens(root, files, val_percent, pattern, cache_dir)
    for name, have, need in (
        ("train", len(train), min_train_tokens),
        ("validation", len(val), min_val_tokens),
    ):
        if have < need:
            raise CorpusError(
                f"corpus {str(root)!r} is too small: its {name} split has {have} tokens (bytes) but "
                f"{need} are needed for the requested lengths and batch; give a larger corpus or "
                f"shorter --train-len, --eval-mults (posenc compare) or --lens (posenc eval)"
            )
    return Corpus(path=str(root), train=train, val=val)


class Batch(NamedTuple):
    """One training batch: inputs ``x`` and targets ``y`` ``(B, T)`` int64 (y is x shifted by one), and
    ``answers`` ``(B, T)`` bool, the targets that only far context predicts (the answer bytes of the
    training mix's tasks; all False for text)."""

    x: torch.Tensor
    y: torch.Tensor
    answers: torch.Tensor


def batch_at(
    tokens: np.ndarray,
    step: int,
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    copy_fraction: float = 0.0,
    passkey_fraction: float = 0.0,
    mix: str | None = None,
) -> Batch:
    """The training batch for one step: ``(x, y, answers)``, each ``(batch_size, seq_len)``, y = x shifted.

    Window starts are drawn from a generator seeded by ``(seed, step)`` alone, so a run resumed at
    step s sees exactly the batches an uninterrupted run would, with no sampler state to save, and
    every DDP rank draws the same global batch (each then trains on its own rows of it).

    ``copy_fraction``: each row is, with this probability, a repeated segment (:func:`repeat_rows`): its
    first ``ceil((seq_len + 1) / 2)`` tokens again after themselves, a task only attention to far
    tokens can solve. ``passkey_fraction``: each other row is, with this probability, a passkey prompt
    with its answer built from its own bytes (:func:`posenc.lab.passkey.passkey_rows`); the two shares
    add up to at most 1. The draws come after the starts, so 0 and 0 give exactly the batches of before,
    and a copy share alone the batches it gave before the passkey share existed.

    ``mix``: the training mix ``"recall=0.2,copy=0.2,passkey=0.05"`` (:func:`posenc.lab.mix.mix_rows`),
    drawn after the starts too, so no mix gives exactly the batches of before; not beside the two shares
    above (:func:`posenc.lab.mix.check_training_mix`).

    ``answers`` marks the targets each task's builder names as its answers (a repeated segment's: its
    repeat after the first byte), which the loss may weigh apart (``--answer-weight``).
    """
    n_starts = len(tokens) - seq_len - 1
    if n_starts < 1:
        raise CorpusError(
            f"seq_len={seq_len} needs more than {seq_len + 1} tokens; the split has {len(tokens)}"
        )
    # The factor 4099 once left room for a rank term; it stays so that every run's batches stay the same.
    # torch reads a seed modulo 2**64 (a negative one too): reduced first, any int64 seed and step fit
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 % 2**64)
    starts = torch.randint(0, n_starts + 1, (batch_size,), generator=gen).numpy()
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    window = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    answers = torch.zeros(window.shape, dtype=torch.bool)
    if copy_fraction > 0 or passkey_fraction > 0:
        if copy_fraction + passkey_fraction > 1:
            raise CorpusError(
                f"copy_fraction={copy_fraction} and passkey_fraction={passkey_fraction} add up to more than 1"
            )
        u = torch.rand(batch_size, generator=gen)
        copies = u < copy_fraction
        window[copies] = repeat_rows(window[copies])
        answers[copies, _repeat_start(window.shape[1]) + 1 :] = True
        if passkey_fraction > 0:
            keys = ~copies & (u < copy_fraction + passkey_fraction)
            window[keys], answers[keys] = passkey_rows(window[keys], gen)
    if mix:
        window, _, answers = mix_rows(window, mix, gen)
    return Batch(window[:, :-1], window[:, 1:], answers[:, 1:])


def loss_weights(answers: torch.Tensor, answer_weight: float) -> torch.Tensor | None:
    """Each target's loss weight ``(B, T)`` float32: ``answer_weight`` on the answers ``(B, T)`` bool and 1
    elsewhere, divided by their mean, so that ``mean(weights * losses)`` is the weighted mean of the losses
    (and a slice of the rows or of the sequence keeps the whole batch's scale); None at weight 1."""
    if answer_weight == 1:
        return None
    weights = torch.where(answers, float(answer_weight), 1.0)
    return weights / weights.mean()


def _repeat_start(length: int) -> int:
    """Where the repeat of a row of ``length`` begins: after its first ``ceil(length / 2)`` tokens."""
    return (length + 1) // 2


def repeat_rows(rows: torch.Tensor) -> torch.Tensor:
    """Rows ``(n, T)`` whose first ``ceil(T / 2)`` tokens are repeated to fill them: ``s + s``, cut to T."""
    half = _repeat_start(rows.shape[1])
    return torch.cat((rows[:, :half], rows[:, :half]), dim=1)[:, : rows.shape[1]]


def sliding_windows(tokens: np.ndarray, length: int, stride: int, n_scored: int, start: int) -> torch.Tensor:
    """Overlapping evaluation windows ``(n, length + 1)`` whose last ``stride`` targets tile the text.

    Window j ends at token ``start + (j + 1) * stride`` (its last target) and begins ``length`` tokens
    earlier; scoring only its last ``stride`` targets scores every token of ``[start + 1, start + n *
    stride]`` once, each with at least ``length - stride + 1`` tokens of context (the ALiBi paper's
    sliding-window evaluation, Press et al. 2021, appendix). ``start >= length`` lets every length score
    the same tokens. ``n = n_scored // stride`` windows, fewer when the split is too short.
    """
    if start < length:
        raise CorpusError(f"sliding windows: start={start} must be >= length={length}")
    n = min(max(1, n_scored // stride), (len(tokens) - 1 - start) // stride)
    if n < 1:
        raise CorpusError(
            f"sliding evaluation at length {length} needs {start + stride + 1} tokens; the split has "
            f"{len(tokens)}"
        )
    ends = start + (np.arange(n) + 1) * stride
    idx = (ends - length)[:, None] + np.arange(length + 1)[None, :]
    return torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))


def windows(tokens: np.ndarray, length: int, max_tokens: int) -> torch.Tensor:
    """Non-overlapping evaluation windows: ``(n, length + 1)`` int64 over the first ~``max_tokens`` tokens.

    Every length covers the same stretch of text (the first ``max_tokens`` predicted tokens), so
    perplexities at different lengths are measured on the same tokens.
    """
    n = max(1, max_tokens // length)
    n = min(n, (len(tokens) - 1) // length)
    if n < 1:
        raise CorpusError(
            f"evaluation length {length} needs {length + 1} tokens; the split has {len(tokens)}"
        )
    idx = np.arange(n)[:, None] * length + np.arange(length + 1)[None, :]
    return torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
