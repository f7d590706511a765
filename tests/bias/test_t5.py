"""T5Bias against posenc.reference and transformers' T5Attention (buckets, compute_bias, attention)."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

import posenc
from posenc import T5Bias
from posenc import reference as R
from posenc.bias import t5_relative_bucket

CONFIGS = [(32, 128), (8, 20), (64, 512), (16, 1000)]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_buckets,max_distance", CONFIGS)
def test_buckets_match_transformers_and_reference(num_buckets, max_distance, bidirectional):
    relative = torch.arange(-3000, 3000)
    want = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    got = t5_relative_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(got, want)
    oracle = [R.t5_relative_bucket(int(r), bidirectional, num_buckets, max_distance) for r in relative]
    np.testing.assert_array_equal(want.numpy(), oracle)


def test_last_causal_bucket_starts_at_113():
    buckets = t5_relative_bucket(-torch.arange(300), False, 32, 128)
    assert int(buckets[112]) == 30 and int(buckets[113]) == 31 and bool((buckets[113:] == 31).all())


def _t5_attention(is_decoder: bool, heads=4, num_buckets=32, max_distance=128) -> T5Attention:
    config = T5Config(
        d_model=16,
        d_kv=4,
        num_heads=heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=is_decoder,
        dropout_rate=0.0,
    )
    torch.manual_seed(0)
    layer = T5Attention(config, has_relative_attention_bias=True).eval()
    with torch.no_grad():
        layer.relative_attention_bias.weight.normal_()
    return layer


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize("q_len,k_len", [(7, 7), (1, 300), (5, 160)])
def test_bias_equals_transformers_compute_bias(is_decoder, q_len, k_len):
    layer = _t5_attention(is_decoder)
    t5 = T5Bias.from_transformers(layer)
    assert t5.bidirectional is (not is_decoder) and (t5.num_buckets, t5.max_distance) == (32, 128)
    want = layer.compute_bias(q_len, k_len, past_seen_tokens=k_len - q_len)[0]
    torch.testing.assert_close(t5.bias(q_len, k_len, causal=False), want, rtol=0, atol=0)


@given(st.integers(1, 30), st.integers(0, 30), st.booleans(), st.sampled_from(CONFIGS))
def test_bias_matches_reference(q_len, extra, bidirectional, config):
    t5 = T5Bias(3, *config, bidirectional=bidirectional)
    want = R.t5_bias(q_len, q_len + extra, t5.weight, bidirectional, *config)
    got = t5.bias(q_len, q_len + extra, causal=False)
    np.testing.assert_array_equal(got.detach().double().numpy(), want)
    future = torch.arange(q_len + extra)[None, :] > torch.arange(extra, q_len + extra)[:, None]
    assert torch.equal(torch.isneginf(t5.bias(q_len, q_len + extra)), future.expand(3, -1, -1))


def test_attention_with_scale_one_matches_transformers_t5_layer():
    """A decoder T5 layer's output from its own forward and from posenc.attention(scale=1.0) on its q/k/v."""
    layer = _t5_attention(is_decoder=True)
    t5 = T5Bias.from_transformers(layer)
    hidden = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1))
    causal = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    want = layer(hidden, mask=causal)[0]
    q, k, v = (lin(hidden).view(2, 9, 4, 4).transpose(1, 2) for lin in (layer.q, layer.k, layer.v))
    out = posenc.attention(q, k, v, bias=t5, scale=1.0)
    got = layer.o(out.transpose(1, 2).reshape(2, 9, 16))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


def test_weight_learns_through_attention():
    t5 = T5Bias(2)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    posenc.attention(q, k, v, bias=t5, scale=1.0).square().sum().backward()
    assert t5.weight.grad is not None and bool(t5.weight.grad[:6].abs().sum(-1).gt(0).all())
    assert bool((t5.weight.grad[6:] == 0).all())  # distances 0..5 fill buckets 0..5 only


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_buckets must be an integer >= 2, got 1"):
        T5Bias(2, num_buckets=1)
    with pytest.raises(ValueError, match="max_distance must be > the 16 exactly-bucketed"):
        T5Bias(2, max_distance=16)
    with pytest.raises(ValueError, match="bidirectional must be True or False"):
        T5Bias(2, bidirectional="yes")
    layer = T5Attention(T5Config(d_model=16, d_kv=4, num_heads=4), has_relative_attention_bias=False)
    with pytest.raises(ValueError, match="has_relative_attention_bias=True"):
        T5Bias.from_transformers(layer)
