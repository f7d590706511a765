"""posenc.lab.probes: far-context gain and the copy probe against by-hand computations."""

import math

import numpy as np
import pytest
import torch

from posenc.lab.config import GPTConfig
from posenc.lab.evaluate import position_losses
from posenc.lab.model import GPT
from posenc.lab.probes import context_reach, copy_probe, far_context_gain, probe_windows

VAL = (np.arange(4000) * 7919 % 251).astype(np.uint8)


def tiny(encoding="alibi"):
    torch.manual_seed(0)
    return GPT(GPTConfig(encoding=encoding, n_layer=1, n_head=2, d_model=16, max_len=8)).eval()


def nll(model, seq):
    """Per-target NLL of one sequence (list of ids): entry t is -log p(seq[t + 1] | seq[: t + 1])."""
    x = torch.tensor(seq, dtype=torch.int64)[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(x[:, :-1]).double(), -1)[0]
    return [-logp[t, seq[t + 1]].item() for t in range(len(seq) - 1)]


@pytest.mark.parametrize("encoding", ["alibi", "none"])
def test_far_context_gain_is_the_ratio_of_two_by_hand_perplexities(encoding):
    m = tiny(encoding)
    length, train_len, last, n = 32, 8, 5, 3
    full, short = [], []
    for w in range(n):
        seq = VAL[w * length : w * length + length + 1].tolist()
        full += nll(m, seq)[-last:]
        short += nll(m, seq[-(train_len + 1) :])[-last:]  # only the last train_len tokens as context
    expected = math.exp(np.mean(short)) / math.exp(np.mean(full))
    rows = probe_windows(VAL, length, n)
    run = lambda w: position_losses(m, w)  # noqa: E731
    assert far_context_gain(run, rows, train_len, last=last) == pytest.approx(expected, rel=1e-6)
    # reusing the windows protocol's losses of the first rows gives the same number
    reused = position_losses(m, rows[:2])
    assert far_context_gain(run, rows, train_len, last=last, full_losses=reused) == pytest.approx(
        expected, rel=1e-6
    )
    assert far_context_gain(run, probe_windows(VAL, 8, n), train_len) is None  # n <= L: nothing to compare


def test_a_window_of_the_training_length_has_no_far_context_gain():
    """A model that sees only its last L tokens has gain 1 on the last token of each window."""
    m = tiny("alibi")
    train_len, length = 8, 32

    def windowed(w):
        # every target predicted from its last train_len tokens: score position t of a window with a
        # window of its own, the honest model of "attends to L tokens only"
        out = torch.empty(w.shape[0], w.shape[1] - 1, dtype=torch.float64)
        for t in range(w.shape[1] - 1):
            lo = max(0, t + 1 - train_len)
            out[:, t] = position_losses(m, w[:, lo : t + 2])[:, -1]
        return out

    rows = probe_windows(VAL, length, 2)
    assert far_context_gain(windowed, rows, train_len, last=1) == pytest.approx(1.0, abs=1e-6)
    # scoring more than the last token, the short run gives the scored tokens only L - last + 1 .. L
    # tokens of context, so even for this model the gain is not exactly 1
    assert far_context_gain(windowed, rows, train_len, last=4) != pytest.approx(1.0, abs=1e-6)


def test_copy_probe_compares_the_same_bytes_before_and_after_the_repeat():
    m = tiny("rope")
    length, n = 16, 3
    rows = probe_windows(VAL, length, n)
    firsts, repeats = [], []
    for w in range(n):
        seg = VAL[w * length : w * length + length + 1].tolist()[: (length + 2) // 2]  # 9 bytes
        seq = (seg + seg)[: length + 1]  # 17 tokens: the segment, then its first 8 bytes again
        losses = nll(m, seq)
        # bytes 1..7 of the segment: first at positions 1..7, again at positions 10..16
        firsts += [losses[p - 1] for p in range(1, 8)]
        repeats += [losses[p - 1] for p in range(10, 17)]
        assert [seq[p] for p in range(1, 8)] == [seq[p] for p in range(10, 17)]
    first, repeat = copy_probe(lambda w: position_losses(m, w), rows)
    assert first == pytest.approx(math.exp(np.mean(firsts)), rel=1e-6)
    assert repeat == pytest.approx(math.exp(np.mean(repeats)), rel=1e-6)


def test_probe_windows_are_the_first_windows_of_the_windows_protocol():
    rows = probe_windows(VAL, 10, 4)
    assert rows.shape == (4, 11)
    for w in range(4):
        assert rows[w].tolist() == VAL[w * 10 : w * 10 + 11].tolist()
    assert probe_windows(VAL[:35], 10, 48).shape == (3, 11)  # fewer when the split is short


def test_reach_inside_the_training_length_compares_contexts_of_a_quarter_and_a_half():
    # a model whose loss at every target is 1 / (the window's length): the ratio of perplexities is known
    def losses_fn(windows):
        return torch.full(
            (windows.shape[0], windows.shape[1] - 1), 1.0 / windows.shape[1], dtype=torch.float64
        )

    rows = torch.randint(0, 256, (3, 17), generator=torch.Generator().manual_seed(0))
    got = context_reach(losses_fn, rows, 16, last=32)
    assert set(got) == {4, 8}
    assert got[4] == pytest.approx(math.exp(1 / 5 - 1 / 17)) and got[8] == pytest.approx(
        math.exp(1 / 9 - 1 / 17)
    )
    assert context_reach(losses_fn, rows[:, :5], 4) == {}  # no quarter of 4 to speak of


def test_reach_of_a_model_is_the_gain_probe_at_the_shorter_contexts():
    torch.manual_seed(0)
    model = GPT(GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=16)).eval()
    rows = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(1))
    run = lambda w: position_losses(model, w)  # noqa: E731
    got = context_reach(run, rows, 16)
    for c in (4, 8):
        full = run(rows)[:, -4:]
        short = run(rows[:, -(c + 1) :])[:, -4:]  # the same last 4 targets, c tokens of context
        assert got[c] == pytest.approx(math.exp(short.mean().item() - full.mean().item()), rel=1e-12)
