"""The rope-ssmax scheme: RoPE with scalable softmax (Nakanishi 2025, arxiv.org/abs/2501.19399) through the
encoding's query scale: a query that sees n keys times s_h log(n), s learned per head and layer; against
posenc.reference.ssmax_attention, with a KV cache and past the training length."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as R
from posenc.lab.config import GPTConfig
from posenc.lab.encoding import Encoding, QueryScale
from posenc.lab.errors import LabError
from posenc.lab.model import GPT, KVCache, _per_layer
from posenc.lab.train import TrainConfig, make_optimizer


def model(encoding="rope-ssmax", seed=0, max_len=16):
    torch.manual_seed(seed)
    return GPT(GPTConfig(encoding=encoding, n_layer=2, n_head=2, d_model=16, max_len=max_len)).eval()


def ids(batch, length, seed=1):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_s_is_a_parameter_per_head_and_layer_started_so_that_the_training_length_is_plain_softmax():
    m = model(max_len=16)
    assert [tuple(p.shape) for p in m.query_scales] == [(2,), (2,)]
    names = [k for k in m.state_dict() if k.startswith("query_scales.")]
    assert names == ["query_scales.0", "query_scales.1"]
    assert all(torch.allclose(p, torch.full((2,), 1 / math.log(16))) for p in m.query_scales)
    factor = next(_per_layer(m, 16, 0, None, "cpu"))["query_scale"]
    assert factor[:, -1].tolist() == pytest.approx([1.0, 1.0])  # the row that sees L keys


@settings(max_examples=15)
@given(st.integers(1, 9), st.integers(0, 60))
def test_the_query_scale_is_s_log_n_counting_every_key_a_query_sees(q_len, offset):
    m = model()
    with torch.no_grad():
        m.query_scales[0].copy_(torch.tensor([0.3, -1.7]))
        m.query_scales[1].copy_(torch.tensor([2.0, 0.5]))
    n = np.arange(offset + 1, offset + q_len + 1)  # past the training length (16) once offset grows
    for layer, attend in enumerate(_per_layer(m, q_len, offset, None, "cpu")):
        s = m.query_scales[layer].detach().double().numpy()
        np.testing.assert_allclose(attend["query_scale"].detach().numpy(), s[:, None] * np.log(n), rtol=1e-6)


def test_a_layer_attends_as_the_reference_ssmax_when_decoding_past_the_training_length(monkeypatch):
    m = model(max_len=16)
    with torch.no_grad():
        m.query_scales[0].copy_(torch.tensor([0.9, -0.4]))
    seen = {}
    attention = posenc.attention

    def spy(q, k, v, **kw):
        seen.setdefault("out", attention(q, k, v, **kw))
        return seen["out"]

    block = m.blocks[0]
    block.register_forward_pre_hook(lambda mod, args: seen.__setitem__("x", args[0]))
    cache, x = KVCache(2), ids(1, 40)
    m(x[:, :37], cache)  # 37 keys cached: 2.3 x the training length
    seen.clear()
    monkeypatch.setattr(posenc, "attention", spy)
    m(x[:, 37:], cache)
    q, k, v = block.qkv(block.norm1(seen["x"])).view(1, 3, 3, 2, 8).permute(2, 0, 3, 1, 4)
    k, v = cache.k[0], cache.v[0]
    s = m.query_scales[0].detach()
    want = R.ssmax_attention(R.rope(q, np.arange(37, 40)), R.rope(k, np.arange(40)), v, s)
    np.testing.assert_allclose(seen["out"].detach().double().numpy(), want, rtol=1e-4, atol=1e-5)


def test_cached_generation_past_the_training_length_equals_the_full_pass():
    m = model(max_len=16)
    prompt = ids(2, 5, seed=4)
    cached = m.generate(prompt, 40, temperature=0)  # 45 tokens: nearly 3 x the training length
    assert torch.equal(cached, m.generate(prompt, 40, temperature=0, use_cache=False))
    x = ids(2, 48, seed=5)
    cache = KVCache(2)
    steps = [m(x[:, :20], cache)] + [m(x[:, t : t + 4], cache) for t in range(20, 48, 4)]
    torch.testing.assert_close(torch.cat(steps, 1), m(x), rtol=1e-4, atol=1e-4)


def test_s_learns_and_the_scheme_trains_a_few_steps():
    m = model().train()
    x = ids(4, 17, seed=2)
    opt = make_optimizer(m, TrainConfig(lr=3e-3))
    before = [p.detach().clone() for p in m.query_scales]
    losses = []
    for _ in range(4):
        loss = m.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in m.query_scales)
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert all(not torch.equal(a, b) for a, b in zip(before, m.query_scales, strict=True))


def test_a_training_length_with_no_log_is_refused_with_its_name():
    with pytest.raises(LabError, match=r"encoding='rope-ssmax' needs max_len >= 2 .* got 1"):
        model(max_len=1)


def test_under_a_window_a_query_counts_only_the_keys_it_sees():
    enc = Encoding(query_scale=QueryScale()).narrowed(4)
    want = R.blockwise_causal_mask(3, 11, 4).sum(-1)  # queries 8, 9, 10: blocks 4..7 and 8..
    assert enc.keys_seen(3, 11, "cpu").tolist() == want.tolist() == [5, 6, 7]
    assert Encoding(query_scale=QueryScale()).keys_seen(3, 11, "cpu").tolist() == [9, 10, 11]


def test_a_bad_query_scale_is_refused_with_its_name():
    with pytest.raises(LabError, match=r"QueryScale init=nan must be a finite number"):
        QueryScale(init=float("nan"))
    with pytest.raises(LabError, match=r"QueryScale length='log' must be a function"):
        QueryScale(length="log")
