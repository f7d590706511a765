"""Fixtures for the laboratory tests: a small deterministic corpus on disk, a private token cache."""

import random

import pytest

_WORDS = (
    "def",
    "return",
    "self",
    "value",
    "index",
    "for",
    "in",
    "if",
    "else",
    "None",
    "True",
    "import",
    "class",
)


def make_corpus(root, n_files=8, lines=120, seed=0):
    """Write ``n_files`` pseudo-Python files (~3 KB each) under ``root``; returns root."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        sub = root / ("pkg" if i % 2 else "") / f"mod{i}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        body = []
        for j in range(lines):
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6)))
            body.append(f"    x{j % 7} = {words}  # {rng.randint(0, 999)}")
        sub.write_text(f"def f{i}():\n" + "\n".join(body) + "\n")
    return root


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


@pytest.fixture
def corpus(corpus_dir, cache_dir):
    """The small corpus, loaded (train and checkpoint tests)."""
    from posenc.lab.data import load_corpus

    return load_corpus(corpus_dir, cache_dir=cache_dir)


def train_hidden_terms(m, steps: int = 6, seed: int = 2) -> list[float]:
    """``steps`` AdamW steps of the lab model ``m`` on random bytes; every parameter of its hidden-state
    terms (:attr:`posenc.lab.encoding.Encoding.hidden_terms`) must get a non-zero gradient each step.
    Returns the losses."""
    import math

    import torch

    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(seed))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = m.loss(x[:, :-1], x[:, 1:])
        loss.backward()
        grads = [p.grad for t in m.hidden_terms for p in t.parameters()]
        assert all(g is not None and bool(g.abs().sum() > 0) for g in grads)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses), losses
    return losses
