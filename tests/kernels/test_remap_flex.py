"""The FlexAttention path of remapped attention (posenc.kernels.remap_flex): every remap, across several of
FlexAttention's 128-token blocks, against posenc.reference.remapped_attention; its block masks against the
bands they stand for; the refusals. Eager (forward only) on the CPU; the compiled CUDA path and its
gradients run in benchmarks/gpu_check.sh."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as R
from posenc.kernels.remap_blocked import Band
from posenc.kernels.remap_flex import band_mask_mod
from posenc.remap import remap_attention

from ..qkv import random_qkv
from ..remap.cases import oracle

REMAPS = {
    "selfextend": (posenc.SelfExtend(4, 40), lambda lq, lk, o: R.selfextend_distance(lq, lk, 4, 40, o)),
    "rerope": (posenc.ReRoPE(50), lambda lq, lk, o: R.rerope_distance(lq, lk, 50, offset=o)),
    "leaky-rerope": (
        posenc.ReRoPE(50, leaky=3.0, log_n_length=64),
        lambda lq, lk, o: R.rerope_distance(lq, lk, 50, 3.0, o),
    ),
    "string": (posenc.STRING(90, 20), lambda lq, lk, o: R.string_distance(lq, lk, 90, 20, o)),
    "dca": (posenc.DualChunk(100, 10), lambda lq, lk, o: R.dual_chunk_distance(lq, lk, 100, 10, o)),
}


@pytest.mark.parametrize("name", sorted(REMAPS))
@pytest.mark.parametrize("q_len,k_len,offset", [(300, 300, 0), (3, 290, 17)])
def test_every_remap_on_flex_is_the_oracle(name, q_len, k_len, offset):
    remap, distance = REMAPS[name]
    rotary = posenc.RotaryEmbedding(8, layout="half")
    c = dict(batch=1, heads=4, kv_heads=2, q_len=q_len, k_len=k_len, head_dim=8, v_dim=6)
    q, k, v = random_qkv(c, torch.float64)
    got = remap_attention(q, k, v, rotary, remap, offset=offset, kernel="flex")
    want = oracle(q, k, v, rotary, distance(q_len, k_len, offset), remap, offset)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_flex_with_sinks_is_the_flash_kernels_in_float32():
    rotary = posenc.RotaryEmbedding(8, layout="half")
    c = dict(batch=2, heads=4, kv_heads=1, q_len=260, k_len=260, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, torch.float32)
    sinks = torch.tensor([-1.0, 0.0, 1.5, 3.0])
    kw = dict(offset=0, sinks=sinks)
    flex = remap_attention(q, k, v, rotary, posenc.SelfExtend(3, 30), kernel="flex", **kw)
    flash = remap_attention(q, k, v, rotary, posenc.SelfExtend(3, 30), kernel="flash", **kw)
    torch.testing.assert_close(flex, flash, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "band", [Band(0, 7), Band(7, float("inf")), Band(1, 2, unit=5), Band(2, float("inf"), 5)]
)
def test_a_block_mask_admits_exactly_its_bands_pairs(band):
    from torch.nn.attention.flex_attention import create_mask

    q_len, k_len, offset = 9, 40, 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = create_mask(
            band_mask_mod(band, offset + k_len - q_len, offset), None, None, q_len, k_len, "cpu"
        )
    j = torch.arange(offset, offset + k_len)
    assert torch.equal(got[0, 0], band.inside(j[k_len - q_len :], j))


@settings(max_examples=40, deadline=None)
@given(
    lo=st.integers(0, 6),
    width=st.one_of(st.integers(1, 8), st.just(float("inf"))),
    unit=st.integers(1, 5),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_a_band_over_rows_holds_each_rows_pairs(lo, width, unit, rows, seed):
    # the rows of a batch at their own positions: (B, q) against (B, k), as numpy says pair by pair
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, 60, (rows, 5)), rng.integers(0, 60, (rows, 7))
    band = Band(lo, lo + width, unit)
    d = i[:, :, None] // unit - j[:, None, :] // unit
    want = (d >= lo) & (d < lo + width) & (i[:, :, None] >= j[:, None, :])
    got = band.inside(torch.from_numpy(i), torch.from_numpy(j))
    assert got.shape == want.shape and np.array_equal(got.numpy(), want)


def test_flex_on_the_cpu_refuses_to_train_and_flash_refuses_other_devices():
    rotary = posenc.RotaryEmbedding(8)
    c = dict(batch=1, heads=2, kv_heads=2, q_len=4, k_len=4, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, torch.float32, grad=True)
    with pytest.raises(ValueError, match="kernel='flex' has no backward on the CPU"):
        remap_attention(q, k, v, rotary, posenc.ReRoPE(2), kernel="flex")
    with torch.no_grad():
        remap_attention(q, k, v, rotary, posenc.ReRoPE(2), kernel="flex")
    meta = [t.detach().to("meta") for t in (q, k, v)]
    with pytest.raises(ValueError, match="kernel='flash' runs torch's CPU flash kernel; q is on meta"):
        remap_attention(*meta, rotary, posenc.ReRoPE(2), kernel="flash")
    with pytest.raises(ValueError, match="kernel must be 'flash', 'flex', 'blocks' or None, got 'fast'"):
        remap_attention(q, k, v, rotary, posenc.ReRoPE(2), kernel="fast")
