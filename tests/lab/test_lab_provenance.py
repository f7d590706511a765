"""posenc.lab.provenance: the corpus fingerprint against hashlib, the git revision against .git itself."""

import hashlib
import subprocess

import numpy as np
import pytest
import torch

import posenc
import posenc.lab.provenance as prov
from posenc.lab.data import Corpus
from posenc.runs.provenance import git_revision


def test_corpus_fingerprint_is_the_sha256_of_each_split(tmp_path):
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 256, 5000, dtype=np.uint8), rng.integers(0, 256, 300, dtype=np.uint8)
    fp = prov.corpus_fingerprint(Corpus(path=str(tmp_path), train=train, val=val))
    assert fp["path"] == str(tmp_path.resolve())
    assert fp["train"] == {
        "tokens": 5000,
        "sha256": hashlib.sha256(train.tobytes()).hexdigest(),
        "hashed": "all",
    }
    assert fp["val"]["sha256"] == hashlib.sha256(val.tobytes()).hexdigest()


def test_a_large_split_is_fingerprinted_by_its_ends(monkeypatch, tmp_path):
    monkeypatch.setattr(prov, "HASH_ALL_BELOW", 1000)
    monkeypatch.setattr(prov, "HASH_EDGE", 100)
    tokens = (np.arange(5000) % 256).astype(np.uint8)
    fp = prov.corpus_fingerprint(Corpus(path=str(tmp_path), train=tokens, val=tokens[:10]))
    expected = hashlib.sha256(tokens[:100].tobytes() + tokens[-100:].tobytes()).hexdigest()
    assert fp["train"] == {"tokens": 5000, "sha256": expected, "hashed": "first and last 100 bytes"}
    changed = tokens.copy()
    changed[-1] ^= 1
    assert prov.corpus_fingerprint(Corpus(str(tmp_path), changed, tokens[:10]))["train"]["sha256"] != expected


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_revision_reads_the_checkout_and_whether_it_has_changes(tmp_path):
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "a.txt").write_text("one")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = (tmp_path / ".git" / "HEAD").read_text().split()[-1]  # "ref: refs/heads/<branch>"
    commit = (tmp_path / ".git" / head).read_text().strip()
    assert git_revision(tmp_path) == {"commit": commit, "dirty": False}
    (tmp_path / "a.txt").write_text("two")
    assert git_revision(tmp_path) == {"commit": commit, "dirty": True}
    (tmp_path / "outside").mkdir()
    assert git_revision(tmp_path.parent / "no-such-dir") is None


def test_provenance_names_versions_device_settings_and_corpus(tmp_path):
    tokens = np.zeros(10, dtype=np.uint8)
    record = prov.provenance({"steps": 3}, Corpus(str(tmp_path), tokens, tokens), "cpu")
    assert record["posenc"] == posenc.__version__ and record["torch"] == torch.__version__
    assert record["numpy"] == np.__version__
    assert record["device"] == "cpu" and record["settings"] == {"steps": 3}
    assert record["corpus"]["val"]["tokens"] == 10
