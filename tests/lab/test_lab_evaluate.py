"""posenc.lab.evaluate: perplexity protocol against a by-hand computation, extensions, passkey, n/a rows."""

import json
import math

import numpy as np
import pytest
import torch

from posenc.lab.config import GPTConfig
from posenc.lab.errors import LabError
from posenc.lab.evaluate import (
    Row,
    answered,
    evaluate,
    passkey_accuracy,
    passkey_batch,
    passkey_hits,
    perplexities,
)
from posenc.lab.model import GPT

VAL = (np.arange(3000) * 7919 % 256).astype(np.uint8)


def tiny(encoding, max_len=8):
    torch.manual_seed(0)
    return GPT(GPTConfig(encoding=encoding, n_layer=1, n_head=2, d_model=16, max_len=max_len)).eval()


def by_hand(model, tokens, length, max_tokens, start_pos=0):
    """exp(mean NLL) over non-overlapping windows, one window at a time, in float64."""
    total, count = 0.0, 0
    n = max_tokens // length
    for w in range(n):
        seq = torch.tensor(tokens[w * length : w * length + length + 1].astype(np.int64))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(seq[:, :-1]).double(), -1)[0]
        for t in range(start_pos, length):
            total -= logp[t, seq[0, t + 1]].item()
            count += 1
    return math.exp(total / count)


@pytest.mark.parametrize("encoding", ["sinusoidal", "alibi", "rope", "none"])
def test_perplexity_matches_a_by_hand_computation(encoding):
    m = tiny(encoding)
    row = perplexities(m, VAL, [8, 16, 32], train_len=8, max_tokens=256)
    for length in (8, 16, 32):
        assert row.ppl[length] == pytest.approx(by_hand(m, VAL, length, 256), rel=1e-6)
    assert row.ppl_past[8] is None
    assert row.ppl_past[32] == pytest.approx(by_hand(m, VAL, 32, 256, start_pos=8), rel=1e-6)


def test_learned_past_its_table_is_na_with_a_reason_not_a_crash():
    m = tiny("learned", max_len=8)
    row = perplexities(m, VAL, [4, 8, 16, 32], train_len=8, max_tokens=128)
    assert row.ppl[4] is not None and row.ppl[8] is not None
    assert row.ppl[16] is None and row.ppl[32] is None
    assert "position 15" in row.note and "max_len=8" in row.note


def test_rope_extension_rows_agree_with_plain_rope_up_to_the_training_length():
    m = tiny("rope", max_len=8)
    rows = evaluate(m, VAL, [8, 32], train_len=8, max_tokens=256, extensions=("pi", "ntk", "dynamic", "yarn"))
    assert [r.scheme for r in rows] == ["rope", "rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn"]
    plain = rows[0]
    for r in rows[1:]:
        assert r.ppl[8] == pytest.approx(plain.ppl[8], rel=1e-9)
        assert r.ppl[32] != plain.ppl[32]  # an untrained model barely cares, but the frequencies did change
    assert m.rotary.scaling is None  # the model is left as it was


def test_pi_row_equals_a_model_built_with_pi():
    m = tiny("rope", max_len=8)
    row = perplexities(m, VAL, [32], train_len=8, max_tokens=256, extension="pi")
    m.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
    assert row.ppl[32] == pytest.approx(by_hand(m, VAL, 32, 256), rel=1e-6)


def test_non_rope_models_get_only_their_own_row_and_extensions_need_rope():
    assert [r.scheme for r in evaluate(tiny("alibi"), VAL, [8], train_len=8, max_tokens=64)] == ["alibi"]
    with pytest.raises(
        LabError, match=r"extension=.pi. applies to the schemes \[.rope.\]; this model is .alibi."
    ):
        perplexities(tiny("alibi"), VAL, [8], train_len=8, extension="pi")
    with pytest.raises(LabError, match="extension='longer' is not known"):
        perplexities(tiny("rope"), VAL, [16], train_len=8, extension="longer")


class Retriever(GPT):
    """A perfect retriever: after the question it predicts the digits that follow the needle's opening
    quote (either prompt style), everywhere else byte 0. Passkey accuracy must be 1."""

    OPENINGS = ('PASSKEY = "', "The pass key is ")
    QUESTIONS = ('assert PASSKEY == "', "What is the pass key? The pass key is ")

    def forward(self, x, cache=None):
        logits = torch.zeros(*x.shape, 256)
        logits[..., 0] = 1
        for b, row in enumerate(x.tolist()):
            text = bytes(row).decode("latin-1")
            opening = next((o for o in self.OPENINGS if o in text), None)
            if opening is None:  # not a passkey prompt (the perplexity protocols' windows)
                continue
            start = text.index(opening) + len(opening)
            key = text[start : start + 5]
            key = key[: next((i for i, c in enumerate(key) if not c.isdigit()), 5)]
            question = next(q for q in self.QUESTIONS if q in text[start:])
            asked = text.rindex(question) + len(question) - 1  # predicts the key's first byte
            for j, digit in enumerate(key):
                if asked + j < x.shape[1]:
                    logits[b, asked + j] = 0
                    logits[b, asked + j, ord(digit)] = 1
        return logits


def retriever():
    torch.manual_seed(0)
    return Retriever(GPTConfig(encoding="none", n_layer=1, n_head=2, d_model=16, max_len=8))


def test_passkey_accuracy_counts_exact_matches():
    assert passkey_accuracy(retriever(), [150, 200], trials=3) == {150: 1.0, 200: 1.0}
    acc = passkey_accuracy(tiny("rope"), [150], trials=2)
    assert 0.0 <= acc[150] <= 1.0
    assert passkey_accuracy(tiny("learned", max_len=8), [150], trials=1) == {150: None}


@pytest.mark.parametrize("encoding", ["rope", "alibi", "learned"])
def test_answered_is_exactly_greedy_decoding(encoding):
    """One teacher-forced pass decides what greedy decoding would produce: rows continued by the model's
    own greedy bytes are answered, and changing any one answer byte makes them wrong."""
    torch.manual_seed(1)
    m = GPT(GPTConfig(encoding=encoding, n_layer=2, n_head=2, d_model=32, max_len=48)).eval()
    prompts = torch.randint(0, 256, (6, 40))
    greedy = m.generate(prompts, 4, temperature=0)
    assert answered(m, greedy, 4).all()
    for j in range(4):
        wrong = greedy.clone()
        wrong[:, 40 + j] = (wrong[:, 40 + j] + 1) % 256
        assert not answered(m, wrong, 4).any()
    assert answered(m, greedy, 4, tokens_per_batch=44).all()  # one row per forward pass


def test_passkey_batch_is_drawn_per_length_and_fits_it():
    rows, answer = passkey_batch(64, 5, digits=3, style="code", filler=VAL)
    assert rows.shape == (5, 64) and answer == 3
    again, _ = passkey_batch(64, 5, digits=3, style="code", filler=VAL)
    assert torch.equal(rows, again)
    for r in rows.tolist():
        text = bytes(r).decode("latin-1")
        key = text[-3:]
        assert key.isdigit() and f'PASSKEY = "{key}"' in text and text[:-3].endswith('assert PASSKEY == "')
    other_seed, _ = passkey_batch(64, 5, digits=3, seed=1, style="code", filler=VAL)
    assert not torch.equal(rows, other_seed)


def test_passkey_in_perplexities_is_a_share_per_length_and_none_where_too_short():
    row = perplexities(retriever(), VAL, [16, 48, 64], train_len=16, max_tokens=256, passkey_trials=4)
    assert row.passkey == {16: None, 48: 1.0, 64: 1.0}
    m = tiny("rope", max_len=16)
    plain = perplexities(m, VAL, [48], train_len=16, max_tokens=256, passkey_trials=6)
    rows, answer = passkey_batch(48, 6, digits=3, style="code", filler=VAL)
    assert plain.passkey[48] == answered(m, rows, answer).double().mean().item()
    assert perplexities(m, VAL, [48], train_len=16, max_tokens=256).passkey == {}
    learned = tiny("learned", max_len=16)
    assert perplexities(learned, VAL, [48], train_len=16, max_tokens=256, passkey_trials=2).passkey == {
        48: None
    }


def test_row_to_dict_is_the_json_row_of_eval_and_compare():
    row = Row("rope+pi", ppl={8: 2.0, 16: None}, ppl_past={8: None, 16: None}, note="why")
    d = row.to_dict()
    assert list(d) == [
        "scheme",
        "ppl",
        "ppl_past",
        "ppl_sliding",
        "gain",
        "reach",
        "copy_first",
        "copy_repeat",
        "recall",
        "recall_ppl",
        "recall_gain",
        "passkey",
        "note",
    ]
    assert d == {
        "scheme": "rope+pi",
        "ppl": {"8": 2.0, "16": None},
        "ppl_past": {"8": None, "16": None},
        "ppl_sliding": {},
        "gain": {},
        "reach": {},
        "copy_first": {},
        "copy_repeat": {},
        "recall": {},
        "recall_ppl": {},
        "recall_gain": {},
        "passkey": {},
        "note": "why",
    }
    assert json.loads(json.dumps(d)) == d


def sliding_by_hand(model, tokens, length, stride, n_scored, start):
    """exp(mean NLL) of the tokens start+1 .. start+n_scored, each predicted by one forward pass over the
    ``length`` tokens ending where its stride block ends, one window at a time, in float64."""
    total, count = 0.0, 0
    for block in range(n_scored // stride):
        end = start + (block + 1) * stride  # the last target of this block
        seq = torch.tensor(tokens[end - length : end + 1].astype(np.int64))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(seq[:, :-1]).double(), -1)[0]
        for target in range(end - stride + 1, end + 1):
            t = target - (end - length) - 1  # the input position that predicts it
            total -= logp[t, int(tokens[target])].item()
            count += 1
    assert count == n_scored
    return math.exp(total / count)


@pytest.mark.parametrize("encoding", ["alibi", "rope"])
def test_sliding_protocol_matches_a_by_hand_computation(encoding):
    m = tiny(encoding)
    row = perplexities(
        m, VAL, [8, 16, 32], train_len=8, max_tokens=256, protocols=("sliding",), sliding_tokens=64
    )
    for length in (8, 16, 32):
        # every length scores the tokens after the longest one, 32
        assert row.ppl_sliding[length] == pytest.approx(sliding_by_hand(m, VAL, length, 8, 64, 32), rel=1e-6)
    assert row.ppl_past == {} and set(row.ppl) == {8, 16, 32}  # windows is always measured


def test_probes_are_measured_per_length_and_na_where_the_model_cannot_go():
    m = tiny("rope")
    row = perplexities(m, VAL, [8, 16], train_len=8, max_tokens=256, probe_windows=3)
    assert row.gain[8] is None and row.gain[16] > 0
    assert set(row.copy_first) == set(row.copy_repeat) == {8, 16}
    learned = perplexities(tiny("learned"), VAL, [8, 16], train_len=8, max_tokens=256, probe_windows=3)
    assert learned.copy_first[8] is not None and learned.copy_first[16] is None
    assert learned.gain == {8: None, 16: None}
    none = perplexities(m, VAL, [8, 16], train_len=8, max_tokens=256, probe_windows=0)
    assert none.gain == {} and none.copy_first == {}


def test_passkey_with_an_extension_leaves_the_model_as_it_was():
    m = tiny("rope", max_len=8)
    original = m.rotary
    acc = passkey_accuracy(m, [110], trials=1, extension="yarn")
    assert set(acc) == {110} and m.rotary is original
    with pytest.raises(
        LabError, match=r"extension=.pi. applies to the schemes \[.rope.\]; this model is .alibi."
    ):
        passkey_accuracy(tiny("alibi"), [110], trials=1, extension="pi")


def test_code_passkey_with_corpus_filler_fits_inside_a_short_training_length():
    filler = np.frombuffer(b"x = 1\n" * 100, dtype=np.uint8)
    hits = passkey_hits(retriever(), [48, 64], trials=5, digits=3, style="code", filler=filler)
    assert hits == {48: 5, 64: 5}
    with pytest.raises(LabError, match="passkey filler has 30 tokens; length 48 needs more"):
        passkey_hits(retriever(), [48], trials=1, digits=3, style="code", filler=filler[:30])
