"""posenc.lab.data: file discovery, split by file, token cache, batches and windows."""

import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.lab.data import (
    batch_at,
    default_corpus,
    is_validation_file,
    list_files,
    load_corpus,
    repeat_rows,
    sliding_windows,
    windows,
)
from posenc.lab.errors import CorpusError
from posenc.lab.tokenizer import decode, encode


def test_tokens_are_the_file_bytes_split_by_file(corpus_dir, cache_dir):
    c = load_corpus(corpus_dir, cache_dir=cache_dir, val_percent=30)
    files = sorted(corpus_dir.rglob("*.py"), key=lambda p: p.relative_to(corpus_dir).as_posix())
    val = [f for f in files if is_validation_file(f.relative_to(corpus_dir).as_posix(), 30)]
    train = [f for f in files if f not in val]
    assert val and train
    expect_train = b"".join(f.read_bytes() + b"\0" for f in train)
    expect_val = b"".join(f.read_bytes() + b"\0" for f in val)
    assert bytes(c.train) == expect_train
    assert bytes(c.val) == expect_val


def test_split_is_a_stable_hash_of_the_relative_path():
    # Independent: recompute the rule from its definition (sha256 of the path, 10000 buckets).
    import hashlib

    for rel in ("a.py", "pkg/b.py", "x/y/z.txt"):
        bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:16], 16) % 10_000
        assert is_validation_file(rel, 5.0) == (bucket < 500)


def test_cache_is_a_memory_map_and_is_rebuilt_when_a_file_changes(corpus_dir, cache_dir, tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    for f in corpus_dir.rglob("*.py"):
        dst = root / f.relative_to(corpus_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(f.read_bytes())
    first = load_corpus(root, cache_dir=cache_dir)
    assert isinstance(first.train, np.memmap) or isinstance(getattr(first.train, "base", None), np.memmap)
    entries = list(cache_dir.iterdir())
    assert len(entries) == 1
    again = load_corpus(root, cache_dir=cache_dir)
    assert list(cache_dir.iterdir()) == entries and np.array_equal(again.train, first.train)
    target = sorted(root.rglob("*.py"))[0]
    target.write_text("changed\n")
    os.utime(target, ns=(1, 1))
    changed = load_corpus(root, cache_dir=cache_dir)
    assert len(list(cache_dir.iterdir())) == 2
    assert len(changed.train) + len(changed.val) != len(first.train) + len(first.val)


def test_single_file_corpus_keeps_its_tail_for_validation(tmp_path, cache_dir):
    f = tmp_path / "book.txt"
    f.write_bytes((bytes(range(1, 256)) + b"\n") * 8)  # every byte but NUL, which would make it binary
    c = load_corpus(f, cache_dir=cache_dir, val_percent=25)
    assert bytes(c.train) + bytes(c.val) == f.read_bytes()
    assert len(c.val) == 512


def test_default_corpus_is_the_stdlib_without_tests():
    root = Path(sysconfig.get_paths()["stdlib"])
    assert default_corpus() == root
    files = list_files(root, "*.py")
    rels = [f.relative_to(root).as_posix() for f in files]
    assert "os.py" in rels and "json/decoder.py" in rels
    assert not any(r.startswith("test/") or "/test/" in r or "site-packages" in r for r in rels)


@pytest.mark.parametrize("make", ["missing", "empty", "binary", "binary file"])
def test_unusable_corpus_is_a_clear_error(tmp_path, cache_dir, make):
    path = tmp_path / "corpus"
    if make in ("empty", "binary"):
        path.mkdir()
    if make == "binary":
        (path / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    if make == "binary file":  # refused like a folder holding only this file
        path.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(CorpusError, match=str(path)):
        load_corpus(path, cache_dir=cache_dir)
    assert not cache_dir.exists() or not any(cache_dir.rglob("*.npy"))


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_token_cache_files_get_the_mode_the_umask_allows(corpus_dir, tmp_path, umask):
    old = os.umask(umask)
    try:
        load_corpus(corpus_dir, cache_dir=tmp_path / "cache")
    finally:
        os.umask(old)
    files = sorted((tmp_path / "cache").rglob("*.npy"))
    assert [f.name for f in files] == ["train.npy", "val.npy"]
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f


def test_too_small_corpus_names_the_path_and_the_need(tmp_path, cache_dir):
    f = tmp_path / "tiny.txt"
    f.write_text("hello world\n" * 3)
    with pytest.raises(CorpusError, match=r"tiny\.txt.*too small.*1000 are needed"):
        load_corpus(f, cache_dir=cache_dir, min_train_tokens=1000)


def test_batch_is_deterministic_shifted_and_step_dependent():
    tokens = np.arange(1000, dtype=np.int64) % 251
    x, y, _ = batch_at(tokens, 7, batch_size=4, seq_len=10, seed=3)
    x2, y2, _ = batch_at(tokens, 7, batch_size=4, seq_len=10, seed=3)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (4, 10) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    x3, _, _ = batch_at(tokens, 8, batch_size=4, seq_len=10, seed=3)
    assert not torch.equal(x, x3)


def test_batch_rows_are_windows_of_the_corpus():
    tokens = np.arange(5000, dtype=np.int64)  # every value unique: a row's first value is its start
    x, y, _ = batch_at(tokens, 0, batch_size=8, seq_len=16, seed=0)
    for row, target in zip(x, y, strict=True):
        s = int(row[0])
        assert row.tolist() == list(range(s, s + 16))
        assert target.tolist() == list(range(s + 1, s + 17))
        assert s + 17 <= len(tokens)


def test_eval_windows_do_not_overlap_and_cover_the_same_tokens():
    tokens = np.arange(10_000, dtype=np.int64)
    for length in (16, 64, 128):
        w = windows(tokens, length, max_tokens=1024)
        assert w.shape == (1024 // length, length + 1)
        starts = w[:, 0].tolist()
        assert starts == [i * length for i in range(len(starts))]
        predicted = w[:, 1:].reshape(-1)
        assert predicted.tolist() == list(range(1, 1025))


def test_window_longer_than_split_is_an_error():
    with pytest.raises(CorpusError, match="evaluation length 100"):
        windows(np.zeros(50, dtype=np.uint8), 100, 1000)


def test_encode_decode_round_trip():
    text = "déf f(x):\n    return x  # ü"
    assert decode(encode(text)) == text
    assert len(encode(text)) == len(text.encode("utf-8"))


def test_sliding_windows_score_every_token_after_start_once_with_enough_context():
    tokens = (np.arange(500) % 251).astype(np.uint8)
    length, stride, start = 24, 8, 40
    w = sliding_windows(tokens, length, stride, n_scored=64, start=start)
    assert w.shape == (8, length + 1)
    scored = []
    for j, row in enumerate(w.tolist()):
        first = start + (j + 1) * stride - length  # the window's first token
        assert row == tokens[first : first + length + 1].tolist()
        targets = list(range(first + 1, first + length + 1))[-stride:]
        assert targets[0] - first >= length - stride + 1  # context of the first scored token
        scored += targets
    assert scored == list(range(start + 1, start + 65))
    assert sliding_windows(tokens, length, stride, n_scored=10_000, start=start).shape[0] == (499 - 40) // 8
    with pytest.raises(CorpusError, match="start=10 must be >= length=24"):
        sliding_windows(tokens, length, stride, 64, start=10)
    with pytest.raises(CorpusError, match="needs 549 tokens; the split has 500"):
        sliding_windows(tokens, length, stride, 64, start=540)


def test_repeat_rows_repeat_the_first_half():
    rows = torch.arange(14).view(2, 7)
    assert repeat_rows(rows).tolist() == [[0, 1, 2, 3, 0, 1, 2], [7, 8, 9, 10, 7, 8, 9]]
    assert repeat_rows(torch.arange(6).view(1, 6)).tolist() == [[0, 1, 2, 0, 1, 2]]


def test_copy_fraction_makes_that_share_of_rows_repeat_and_zero_changes_nothing():
    tokens = (np.arange(20_000) * 7919 % 256).astype(np.uint8)
    plain = batch_at(tokens, 3, batch_size=64, seq_len=16, seed=1)
    zero = batch_at(tokens, 3, batch_size=64, seq_len=16, seed=1, copy_fraction=0.0)
    assert all(torch.equal(a, b) for a, b in zip(plain, zero, strict=True))
    x, y, _ = batch_at(tokens, 3, batch_size=64, seq_len=16, seed=1, copy_fraction=0.5)
    window = torch.cat((x, y[:, -1:]), dim=1)  # the 17 tokens of each row
    repeated = (window[:, 9:] == window[:, :8]).all(dim=1)
    assert torch.equal(window[~repeated], torch.cat((plain[0], plain[1][:, -1:]), 1)[~repeated])
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert 16 <= int(repeated.sum()) <= 48  # about half of 64
    again = batch_at(tokens, 3, batch_size=64, seq_len=16, seed=1, copy_fraction=0.5)
    assert torch.equal(again[0], x)  # a pure function of (seed, step)
    x1, _, answers = batch_at(tokens, 3, batch_size=64, seq_len=16, seed=1, copy_fraction=1.0)
    assert torch.equal(x1[:, 9:], x1[:, :7])
    # the answers: the repeat's targets after its first byte (window bytes 10..16, targets 9..15)
    assert answers[:, 9:].all() and not answers[:, :9].any()


def test_passkey_fraction_makes_that_share_of_rows_passkey_prompts_and_keeps_the_copies():
    tokens = (np.arange(20_000) * 7919 % 256).astype(np.uint8)
    kw = dict(batch_size=64, seq_len=64, seed=1)
    plain = batch_at(tokens, 3, **kw)
    copies = batch_at(tokens, 3, copy_fraction=0.25, **kw)
    both = batch_at(tokens, 3, copy_fraction=0.25, passkey_fraction=0.5, **kw)
    window = torch.cat((both[0], both[1][:, -1:]), dim=1)
    asked = torch.tensor([b'assert PASSKEY == "' in bytes(r) for r in window.tolist()])
    repeated = (window[:, 33:] == window[:, :32]).all(dim=1)
    # the copy rows are exactly those of a copy-only batch; the passkey rows are drawn from the rest
    assert torch.equal(both[0][repeated], copies[0][repeated]) and not (asked & repeated).any()
    untouched = ~asked & ~repeated
    assert torch.equal(both[0][untouched], plain[0][untouched])
    assert 16 <= int(asked.sum()) <= 48  # about half of 64
    assert torch.equal(both[0][:, 1:], both[1][:, :-1])
    # after the question comes each passkey row's key, as targets
    for row in window[asked].tolist():
        text = bytes(row).decode("latin-1")
        key = text.split('PASSKEY = "')[1].split('"')[0]
        assert text.rsplit('assert PASSKEY == "', 1)[1].startswith(key)
    with pytest.raises(
        CorpusError, match="copy_fraction=0.75 and passkey_fraction=0.5 add up to more than 1"
    ):
        batch_at(tokens, 3, copy_fraction=0.75, passkey_fraction=0.5, **kw)


def test_the_too_small_message_names_only_flags_that_exist(tmp_path):
    import re

    from posenc.cli import build_parser

    parser = build_parser()
    flags = {
        opt
        for action in parser._subparsers._group_actions
        for sub in action.choices.values()
        for a in sub._actions
        for opt in a.option_strings
    }
    (tmp_path / "tiny.txt").write_text("x" * 100)
    with pytest.raises(CorpusError) as info:
        load_corpus(tmp_path / "tiny.txt", cache_dir=tmp_path / "cache", min_val_tokens=1000)
    named = set(re.findall(r"--[a-z-]+", str(info.value)))
    assert named and named <= flags, named - flags
