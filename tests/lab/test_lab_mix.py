"""posenc.lab.mix and posenc.lab.recall: the training mix's rows (answers only far context predicts), its
shares, determinism and errors; the recall probe against an induction oracle; the long preset's plan."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.cli import build_parser
from posenc.lab.checkpoint import run_state
from posenc.lab.config import GPTConfig, Settings, TrainConfig, settings_for
from posenc.lab.data import batch_at, loss_weights
from posenc.lab.errors import LabError
from posenc.lab.mix import MIX_TASKS, check_training_mix, copy_rows, mix_rows, parse_mix
from posenc.lab.recall import RECALL_ITEM, recall_batch, recall_pairs, recall_rows, recall_scores

# printable bytes, '$' among them (the recall rows must clear it from the filler)
TEXT = np.random.default_rng(0).integers(32, 127, 20000).astype(np.uint8)
ITEM = re.compile(rb"\$([a-z]{2})=([0-9A-Z]{4})")


def rows_of(n, t, seed=0):
    starts = np.random.default_rng(seed).integers(0, len(TEXT) - t, n)
    return torch.tensor(np.stack([TEXT[s : s + t] for s in starts]), dtype=torch.int64)


def items(row: bytes):
    """Every ``$ab=VVVV`` of a row, found by a regular expression: (key, value, where the value starts)."""
    return [(m.group(1), m.group(2), m.start(2)) for m in ITEM.finditer(row)]


@pytest.mark.parametrize("t", [16, 65, 257])
def test_recall_rows_answer_each_late_key_with_its_early_value_found_nowhere_else(t):
    rows = rows_of(40, t)
    out, answers = recall_rows(rows, torch.Generator().manual_seed(1))
    assert out.shape == answers.shape == rows.shape and answers.dtype == torch.bool
    k = recall_pairs(t)
    for before, after, marked in zip(rows.tolist(), out.tolist(), answers.tolist(), strict=True):
        row = bytes(after)
        found = items(row)
        assert row.count(b"$") == len(found) == 2 * k  # every '$' opens a pair or a query
        first, answer_bytes = {}, set()
        for key, value, at in found:
            if key in first:  # a query: its answer is its pair's value, from before it
                answer_bytes |= set(range(at, at + 4))
                pair_value, pair_at = first.pop(key)
                assert value == pair_value and pair_at < at <= t - 4
                # the value occurs in the pair and as the answer only: without the pair, nothing predicts it
                assert row.count(value) == 2
                without_pair = row[: pair_at - 4] + row[pair_at + 4 :]
                assert value not in without_pair[: at - RECALL_ITEM]
            else:
                first[key] = (value, at)
        assert not first  # every pair was asked
        assert {i for i, m in enumerate(marked) if m} == answer_bytes  # the answers: the asked values
        # the rest is the row's own bytes, in order, '$' made a space
        text = ITEM.sub(b"", row)
        assert text == bytes(before[: len(text)]).replace(b"$", b" ")


def test_recall_pairs_come_before_every_query_in_training_and_the_answer_changes_with_the_pair():
    rows = rows_of(20, 129)
    a, _ = recall_rows(rows, torch.Generator().manual_seed(3))
    b, _ = recall_rows(rows, torch.Generator().manual_seed(4))
    for row in a.tolist():
        found = items(bytes(row))
        keys = [key for key, _, _ in found]
        k = len(found) // 2
        assert len(set(keys[:k])) == k and sorted(keys[:k]) == sorted(keys[k:])  # pairs, then queries
    assert not torch.equal(a, b)  # other draws, other pairs, other answers


def test_copy_rows_copy_one_span_forward_and_keep_the_rest():
    rows = rows_of(50, 65)
    out, answers = copy_rows(rows, torch.Generator().manual_seed(0))
    for before, after, marked in zip(rows.tolist(), out.tolist(), answers.tolist(), strict=True):
        # the answers: one stretch of 7 to 15 bytes, the copy after its first byte, which equals an earlier
        # stretch of the row, one byte longer, that ends before the copy begins
        hit = [i for i, m in enumerate(marked) if m]
        b, s = hit[0] - 1, len(hit) + 1
        assert hit == list(range(b + 1, b + s)) and 8 <= s <= 65 // 4
        assert any(after[b : b + s] == after[a : a + s] for a in range(0, b - s + 1))
        changed = [i for i in range(65) if before[i] != after[i]]
        if not changed:
            continue  # the copy happened to equal what it overwrote
        assert b <= changed[0] and changed[-1] < b + s
        lo, hi = changed[0], changed[-1] + 1
        # some earlier span of the original, of at least the changed stretch, was written here
        sources = [
            (a, s)
            for s in range(max(8, hi - lo), 65 // 4 + 1)
            for b in range(max(0, hi - s), lo + 1)
            for a in range(0, b - s + 1)
            if after[b : b + s] == before[a : a + s]
            and after[:b] == before[:b]
            and after[b + s :] == before[b + s :]
        ]
        assert sources
    with pytest.raises(LabError, match="at least 16 bytes"):
        copy_rows(rows_of(2, 15), torch.Generator())


def test_mix_shares_are_honoured_and_the_draws_are_deterministic():
    mix = "recall=0.2,copy=0.3,passkey=0.1"
    window = rows_of(3000, 65)
    out, kinds, answers = mix_rows(window, mix, torch.Generator().manual_seed(5))
    again, kinds2, answers2 = mix_rows(window, mix, torch.Generator().manual_seed(5))
    assert torch.equal(out, again) and torch.equal(kinds, kinds2) and torch.equal(answers, answers2)
    assert torch.equal(answers.any(1), kinds >= 0)  # every task row has answers, no text row has any
    n = len(kinds)
    for j, (name, share) in enumerate([("recall", 0.2), ("copy", 0.3), ("passkey", 0.1)]):
        assert list(MIX_TASKS)[j] == name
        got = (kinds == j).double().mean().item()
        assert abs(got - share) < 4 * math.sqrt(share * (1 - share) / n), name
    text = kinds == -1
    assert torch.equal(out[text], window[text])  # text rows untouched
    assert all(bytes(r).count(b"$") >= 2 for r in out[kinds == 0].tolist())
    assert all(b"PASSKEY" in bytes(r) for r in out[kinds == 2].tolist())


def test_batches_with_a_mix_depend_on_seed_and_step_only_and_no_mix_changes_nothing():
    kw = dict(batch_size=32, seq_len=64, seed=2)
    plain = batch_at(TEXT, 7, **kw)
    assert all(torch.equal(a, b) for a, b in zip(plain, batch_at(TEXT, 7, mix=None, **kw), strict=True))
    mixed = batch_at(TEXT, 7, mix="recall=0.5,copy=0.5", **kw)
    assert all(
        torch.equal(a, b)
        for a, b in zip(mixed, batch_at(TEXT, 7, mix="recall=0.5,copy=0.5", **kw), strict=True)
    )
    assert not torch.equal(mixed[0], plain[0])
    assert torch.equal(mixed[0][:, 1:], mixed[1][:, :-1])  # y is x shifted
    assert not plain.answers.any() and mixed.answers.any()
    # the answers are targets: in a recall row (stretches of 4 answer bytes, a copy's are 7 or more), the
    # input at each answer's first target is the '=' of its query
    x, _, answers = mixed
    recall = 0
    for i in range(len(x)):
        marked = answers[i].tolist()
        starts = [j for j, m in enumerate(marked) if m and (j == 0 or not marked[j - 1])]
        if starts and sum(marked) == 4 * len(starts):
            recall += 1
            assert all(x[i, j] == ord("=") for j in starts)
    assert recall > 5
    other = batch_at(TEXT, 8, mix="recall=0.5,copy=0.5", **kw)
    assert not torch.equal(mixed[0], other[0])


@pytest.mark.parametrize(
    "spec, message",
    [
        ("recall=0.7,copy=0.5", "the shares add up to 1.2; they must add up to at most 1"),
        ("recall=-0.1", "the share of 'recall'=-0.1 must be a number in [0, 1]"),
        ("recall=1.5", "the share of 'recall'=1.5 must be a number in [0, 1]"),
        ("recall=nan", "the share of 'recall'=nan must be a number in [0, 1]"),
        ("recall=lots", "the share of 'recall' must be a number in [0, 1], got 'lots'"),
        ("haystack=0.1", "unknown task 'haystack'; allowed: recall, copy, passkey"),
        ("recall", "'recall' is not NAME=SHARE; e.g. recall=0.2,copy=0.2,passkey=0.05"),
        ("copy=0.1,copy=0.2", "'copy' is given more than once"),
    ],
)
def test_bad_mixes_are_refused_naming_the_value_and_what_is_allowed(spec, message):
    with pytest.raises(LabError, match=re.escape(f"mix={spec!r}")) as err:
        parse_mix(spec)
    assert message in str(err.value)
    with pytest.raises(LabError, match=re.escape(message)):
        Settings(mix=spec)


def test_the_mix_is_canonical_checked_against_the_length_and_part_of_the_run_state():
    assert check_training_mix(" passkey=0.05, recall=0.2,copy=0") == "recall=0.2,passkey=0.05"
    assert check_training_mix("") is None and check_training_mix("recall=0") is None
    s = Settings(mix="copy=0.25,recall=0.5")
    assert s.mix == "recall=0.5,copy=0.25" and s.train_config(3).mix == s.mix
    with pytest.raises(LabError, match=r"mix='passkey=0.1' needs train_len >= 35 .* train_len is 16"):
        Settings(mix="passkey=0.1", train_len=16)
    with pytest.raises(LabError, match="cannot be combined with copy_fraction=0.5"):
        TrainConfig(mix="recall=0.1", copy_fraction=0.5)
    model = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=16)
    assert run_state(model, TrainConfig(mix="recall=0.1"), "c")["train"]["mix"] == "recall=0.1"
    assert "mix" not in run_state(model, TrainConfig(), "c")["train"]  # old checkpoints still resume


@pytest.mark.parametrize("weight", [0.0, -2.0, float("nan"), float("inf")])
def test_an_answer_weight_that_is_not_a_positive_number_is_refused(weight):
    with pytest.raises(LabError, match=re.escape(f"answer_weight={weight}")):
        TrainConfig(mix="recall=0.5", answer_weight=weight)


def test_the_answer_weight_needs_a_mix_and_is_part_of_the_run_state():
    for make in (TrainConfig, Settings):
        with pytest.raises(LabError, match=r"answer_weight=8 weighs the answer bytes .* there is none"):
            make(answer_weight=8.0)
    assert TrainConfig(copy_fraction=0.5, answer_weight=8.0).answer_weight == 8.0  # the old copy share too
    s = Settings(mix="recall=0.5", answer_weight=8.0)
    assert s.train_config(1).answer_weight == 8.0
    model = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=16)
    weighted = TrainConfig(mix="recall=0.5", answer_weight=8.0)
    assert run_state(model, weighted, "c")["train"]["answer_weight"] == 8
    assert "answer_weight" not in run_state(model, TrainConfig(mix="recall=0.5"), "c")["train"]


@settings(max_examples=40, deadline=None)
@given(
    answers=st.lists(st.booleans(), min_size=1, max_size=40),
    weight=st.floats(0.01, 100),
    losses=st.lists(st.floats(0, 10), min_size=40, max_size=40),
)
def test_loss_weights_make_the_mean_of_weighted_losses_the_weighted_mean(answers, weight, losses):
    mask = torch.tensor(answers).view(1, -1)
    loss = torch.tensor(losses[: mask.shape[1]], dtype=torch.float64).view(1, -1)
    w = loss_weights(mask, weight)
    raw = np.where(np.array(answers), weight, 1.0)
    expected = (raw * loss.numpy()).sum() / raw.sum()
    assert (w.double() * loss).mean().item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert loss_weights(mask, 1.0) is None


@settings(max_examples=25, deadline=None)
@given(shares=st.lists(st.floats(0, 1), min_size=3, max_size=3))
def test_any_mix_of_shares_up_to_one_is_accepted_and_more_is_refused(shares):
    spec = ",".join(f"{name}={share!r}" for name, share in zip(MIX_TASKS, shares, strict=True))
    if sum(shares) <= 1:
        assert parse_mix(spec) == {n: s for n, s in zip(MIX_TASKS, shares, strict=True) if s}
    else:
        with pytest.raises(LabError, match="add up to"):
            parse_mix(spec)


# ---------------------------------------------------------------------------------------------- the probe


class Induction(torch.nn.Module):
    """An induction oracle: at each position, the byte that followed the last earlier occurrence of the last
    four bytes gets logit 10 (all others 0); with no earlier occurrence, every byte 0 (uniform)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        logits = torch.zeros(*x.shape, 256)
        for b, row in enumerate(x.tolist()):
            for c in range(3, len(row)):
                gram = row[c - 3 : c + 1]
                for e in range(c - 1, 2, -1):
                    if row[e - 3 : e + 1] == gram:
                        logits[b, c, row[e + 1]] = 10.0
                        break
        return logits


@pytest.mark.parametrize("length", [64, 128, 256])
def test_recall_probe_places_pairs_far_and_scores_an_induction_oracle_exactly(length):
    train_len = 64
    rows, starts = recall_batch(TEXT, length, 3, train_len)
    k = recall_pairs(train_len + 1)
    assert rows.shape == (3, length + 1) and starts.shape == (3, k)
    for row, answer in zip(rows.tolist(), starts.tolist(), strict=True):
        found = items(bytes(row))
        pairs = {key: at for key, _, at in found[:k]}
        for key, _, at in found[k:]:
            assert at in answer
            distance = at - pairs[key]
            assert length // 2 < distance <= length if length > train_len else 0 < distance <= length
            if length > train_len:  # the last L bytes hold every query but no pair
                assert at - 4 >= length + 1 - (train_len + 1) > pairs[key] + 4
    again = recall_batch(TEXT, length, 3, train_len)
    assert torch.equal(again[0], rows)  # every model is asked the same windows
    accuracy, ppl, gain = recall_scores(Induction(), rows, starts, train_len)
    hit = math.log(math.exp(10) + 255) - 10  # the oracle's loss on a byte it copies
    assert accuracy == 1.0 and ppl == pytest.approx(math.exp(hit), rel=1e-5)
    if length == train_len:
        assert gain is None
    else:  # without the pairs the oracle is uniform on every value byte
        assert gain == pytest.approx(math.exp(math.log(256) - hit), rel=1e-5)


def test_recall_probe_is_none_where_the_window_cannot_hold_a_pair_and_its_query():
    assert recall_batch(TEXT, 2 * RECALL_ITEM - 2, 2, 8) is None
    assert recall_batch(TEXT, 2 * RECALL_ITEM - 1, 2, 8) is not None


# ---------------------------------------------------------------------------------------------- long preset


def test_the_long_preset_with_a_mix_and_two_seeds_is_accepted_as_a_plan():
    from posenc.lab.compare import _task_order
    from posenc.runs.flags import flag_values

    args = build_parser().parse_args(
        "compare --preset long --mix recall=0.2,copy=0.2,passkey=0.05 --schemes rope,swan --seeds 2".split()
    )
    s = settings_for(args.preset, **flag_values(Settings, args))
    assert s.mix == "recall=0.2,copy=0.2,passkey=0.05" and s.seeds == 2 and s.schemes == ("rope", "swan")
    assert s.train_len >= 256 and s.n_layer >= 2 and s.n_head >= 4
    assert s.eval_lens[-1] == 8 * s.train_len  # the recall probe's farthest distances
    order, _ = _task_order(s)
    assert [(t.scheme, t.seed) for t in order] == [("rope", 0), ("rope", 1), ("swan", 0), ("swan", 1)]
    assert s.train_config(1).mix == s.mix and s.model_config("swan").max_len == s.train_len
