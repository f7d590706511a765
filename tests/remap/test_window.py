"""Sliding-window remapped attention (remap_attention(window=W): each query takes only the keys at true
distance < W, as transformers' ``sliding_window`` layers do) against posenc.reference.remapped_attention
with the pairs past the window masked out; on every kernel, decoding and gradients; refusals."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import reference as R
from posenc.remap import NoRemap, remap_attention

from ..qkv import random_qkv
from .cases import ROTARIES, case, oracle


def _plain(q_len, k_len, offset):
    i, j = np.arange(k_len - q_len, k_len)[:, None], np.arange(k_len)[None, :]
    return np.where(j <= i, (i - j).astype(np.float64), np.nan)


DISTANCES = {
    "none": (NoRemap(), _plain),
    "selfextend": (posenc.SelfExtend(2, 5), lambda lq, lk, o: R.selfextend_distance(lq, lk, 2, 5, o)),
    "leaky-rerope": (posenc.ReRoPE(4, leaky=2.0), lambda lq, lk, o: R.rerope_distance(lq, lk, 4, 2.0, o)),
    "string": (posenc.STRING(6, 2), lambda lq, lk, o: R.string_distance(lq, lk, 6, 2, o)),
}


def _windowed(distance: np.ndarray, q_len: int, k_len: int, window: int) -> np.ndarray:
    true = _plain(q_len, k_len, 0)
    return np.where(true < window, distance, np.nan)


@given(case(), st.sampled_from(sorted(DISTANCES)), st.integers(1, 12))
def test_a_window_masks_the_pairs_past_it_on_every_kernel(c, name, window):
    remap, distance = DISTANCES[name]
    rotary = posenc.RotaryEmbedding(**ROTARIES[c["rotary"]])
    q, k, v = random_qkv(c, torch.float64)
    lq, lk, o = c["q_len"], c["k_len"], c["offset"]
    got = remap_attention(
        q, k, v, rotary, remap, offset=o, block=c["block"], kernel=c["kernel"], window=window
    )
    want = oracle(q, k, v, rotary, _windowed(distance(lq, lk, o), lq, lk, window), remap, o)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_gradients_and_decoding_with_a_window():
    rotary = posenc.RotaryEmbedding(8, layout="half")
    c = dict(batch=1, heads=2, kv_heads=1, q_len=10, k_len=12, head_dim=8, v_dim=4)
    q, k, v = random_qkv(c, torch.float64, grad=True)
    for kernel in ("flash", "blocks"):
        torch.autograd.gradcheck(
            lambda q, k, v, kernel=kernel: remap_attention(
                q, k, v, rotary, posenc.SelfExtend(2, 3), offset=2, block=3, kernel=kernel, window=7
            ),
            (q, k, v),
        )
    q, k, v = (t.detach() for t in random_qkv(dict(c, q_len=20, k_len=20), torch.float64))
    full = remap_attention(q, k, v, rotary, posenc.ReRoPE(3), window=6)
    steps = [
        remap_attention(
            q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], rotary, posenc.ReRoPE(3), window=6
        )
        for t in range(20)
    ]
    torch.testing.assert_close(torch.cat(steps, 2), full, rtol=1e-12, atol=1e-12)


def test_a_window_is_refused_where_it_has_no_meaning():
    rotary = posenc.RotaryEmbedding(8)
    q, k, v = random_qkv(dict(batch=1, heads=2, kv_heads=2, q_len=4, k_len=4, head_dim=8, v_dim=8))
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        remap_attention(q, k, v, rotary, posenc.ReRoPE(2), window=0)
    with pytest.raises(ValueError, match="window= limits distances in tokens; DualChunk"):
        remap_attention(q, k, v, rotary, posenc.DualChunk(4, 1), window=3)
