"""Attention sinks (a learned logit per head, one more softmax entry with no value, as in GPT-OSS) on both
kernels, with and without a remap, against posenc.reference.remapped_attention; gradients; errors."""

import numpy as np
import pytest
import torch
from hypothesis import given

import posenc
from posenc import reference as R
from posenc.remap import remap_attention
from posenc.remap.base import NoRemap

from ..qkv import random_qkv
from .cases import ROTARIES, case


def _plain_distance(q_len, k_len, offset):
    i, j = np.arange(k_len - q_len, k_len)[:, None], np.arange(k_len)[None, :]
    return np.where(j <= i, (i - j).astype(np.float64), np.nan)


@given(case())
def test_sinks_with_and_without_a_remap_are_the_oracles(c):
    rotary = posenc.RotaryEmbedding(**ROTARIES[c["rotary"]])
    q, k, v = random_qkv(c, torch.float64)
    sinks = torch.linspace(-1.0, 2.0, c["heads"], dtype=torch.float64)
    g = c["heads"] // c["kv_heads"]
    inv_freq, factor = rotary.frequencies(c["offset"] + c["k_len"])
    kw = dict(
        layout=rotary.layout, rotary_dim=rotary.rotary_dim, inv_freq=inv_freq.numpy(), attention_factor=factor
    )
    kv = [t.repeat_interleave(g, 1).numpy() for t in (k, v)]
    for remap, dist in (
        (NoRemap(), _plain_distance(c["q_len"], c["k_len"], c["offset"])),
        (posenc.ReRoPE(4), R.rerope_distance(c["q_len"], c["k_len"], 4, offset=c["offset"])),
    ):
        got = remap_attention(
            q, k, v, rotary, remap, offset=c["offset"], block=c["block"], kernel=c["kernel"], sinks=sinks
        )
        want = R.remapped_attention(q.numpy(), *kv, dist, sinks=sinks.numpy(), **kw)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_posenc_attention_takes_sinks_with_rope_without_it_and_with_a_remap():
    c = dict(batch=2, heads=4, kv_heads=2, q_len=9, k_len=9, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, torch.float64)
    sinks = torch.tensor([0.5, -1.0, 3.0, 0.0], dtype=torch.float64)
    rope = posenc.RotaryEmbedding(8)
    dist = _plain_distance(9, 9, 0)
    kv = [t.repeat_interleave(2, 1).numpy() for t in (k, v)]
    want = R.remapped_attention(q.numpy(), *kv, dist, sinks=sinks.numpy())
    np.testing.assert_allclose(posenc.attention(q, k, v, rotary=rope, sinks=sinks).numpy(), want, atol=1e-12)
    no_rope = (
        R.softmax(
            np.concatenate(
                [
                    np.where(np.isnan(dist), -np.inf, q.numpy() @ kv[0].swapaxes(-1, -2) / np.sqrt(8)),
                    np.broadcast_to(sinks.numpy()[:, None, None], (2, 4, 9, 1)),
                ],
                -1,
            )
        )[..., :-1]
        @ kv[1]
    )
    np.testing.assert_allclose(posenc.attention(q, k, v, sinks=sinks).numpy(), no_rope, atol=1e-12)
    # a very negative sink takes no mass: plain attention
    far = torch.full((4,), -1e4, dtype=torch.float64)
    torch.testing.assert_close(
        posenc.attention(q, k, v, rotary=rope, sinks=far), posenc.attention(q, k, v, rotary=rope)
    )


def test_gradients_reach_q_k_v_and_the_sinks_on_both_kernels():
    c = dict(batch=1, heads=2, kv_heads=1, q_len=7, k_len=10, head_dim=8, v_dim=4)
    q, k, v = random_qkv(c, torch.float64, grad=True)
    sinks = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    rope = posenc.RotaryEmbedding(8, layout="half")
    for kernel in ("flash", "blocks"):
        torch.autograd.gradcheck(
            lambda q, k, v, s, kernel=kernel: remap_attention(
                q, k, v, rope, posenc.SelfExtend(2, 3), offset=2, block=3, kernel=kernel, sinks=s
            ),
            (q, k, v, sinks),
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(sinks=torch.zeros(3)),
            r"sinks must be a float tensor of shape \(2,\), one logit per query head",
        ),
        (dict(sinks=torch.zeros(2, dtype=torch.long)), "sinks must be a float tensor"),
        (dict(sinks=torch.tensor([0.0, float("nan")])), "sinks must be finite"),
        (dict(sinks=torch.zeros(2), causal=False), "sinks= works with causal attention only"),
        (dict(sinks=torch.zeros(2), bias=posenc.ALiBi(2)), "sinks= takes no bias"),
        (
            dict(sinks=torch.zeros(2), positions=torch.arange(6)),
            "positions= and k_positions= are not supported",
        ),
    ],
)
def test_bad_sinks_are_refused_by_name(kwargs, message):
    q = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match=message):
        posenc.attention(q, q, q, rotary=posenc.RotaryEmbedding(8), **kwargs)


def test_sinks_accept_every_length_plain_attention_does():
    """A rotary that knows its trained length (max_position_embeddings) limits no plain attention call, and
    sinks= (no remap: every distance as it is) adds none: past that length it is still the oracle."""
    rope = posenc.RotaryEmbedding(8, max_position_embeddings=4)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for n in (3, 9, 9))
    sinks = torch.tensor([0.3, -0.7], dtype=torch.float64)
    got = posenc.attention(q, k, v, rotary=rope, sinks=sinks)
    want = R.remapped_attention(q, k, v, _plain_distance(3, 9, 0), sinks=sinks.numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    NoRemap().check_length(10**6, 4)  # NoRemap extends nothing, so it refuses nothing
