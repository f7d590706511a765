"""Inkling's hidden-state-conditioned banded relative bias (posenc.banded_attention, posenc.BandedRelative,
posenc.attention(bias=posenc.BandedBias(r, P))) against posenc.reference.banded_attention (values, float32 and
float64, extents shorter and longer than the sequence, q_len < k_len) and a plain-torch attention that
materialises the (batch, heads, L, L) bias by gathering (values and gradients); the bias exactly zero beyond
the extent and after the query; no (L, L, d_rel) tensor, nor every row's profiles at once; decoding;
errors."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import posenc
from posenc import reference as R
from posenc.bias.banded import banded_bias

from ..peak_memory import peak_rise_mib
from ..qkv import draw_shapes, random_qkv
from .oracles import assert_same_gradients


@st.composite
def case(draw):
    return dict(
        draw_shapes(draw),
        d_rel=draw(st.sampled_from([1, 3, 8])),
        extent=draw(st.sampled_from([1, 2, 5, 13, 40])),  # shorter and longer than the sequence (<= 24)
        block=draw(st.one_of(st.none(), st.integers(1, 8))),
        scale=draw(st.sampled_from([None, 0.7])),
        strength=draw(st.sampled_from([0.1, 1.0, 5.0])),  # the size of the bias against the content scores
    )


def terms(c, dtype=torch.float32, grad=False, seed=7):
    """r (batch, heads, q_len, d_rel) and P (d_rel, extent), products of about ``strength``."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(c["batch"], c["heads"], c["q_len"], c["d_rel"], generator=gen, dtype=dtype)
    table = torch.randn(c["d_rel"], c["extent"], generator=gen, dtype=dtype)
    r = r * (c["strength"] / math.sqrt(c["d_rel"]))
    return r.requires_grad_(grad), table.requires_grad_(grad)


def oracle(q, k, v, r, table, scale=None):
    g = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(t.detach().double().numpy(), g, axis=1) for t in (k, v))
    arrays = (t.detach().double().numpy() for t in (q, r, table))
    qq, rr, pp = arrays
    return R.banded_attention(qq, kk, vv, rr, pp, scale)


def materialised(q, k, v, r, table, scale=None):
    """The (batch, heads, q_len, k_len) bias gathered from the (q_len, extent) profiles by distance, masked
    to 0 beyond the extent, and a softmax over it, all in plain torch."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    lq, lk, extent = q.shape[2], k.shape[2], table.shape[1]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    d = torch.arange(lk - lq, lk)[:, None] - torch.arange(lk)[None, :]
    profiles = r @ table
    bias = profiles.gather(-1, d.clamp(0, extent - 1).expand(*profiles.shape[:2], -1, -1))
    bias = bias.masked_fill((d < 0) | (d >= extent), 0.0)
    scores = (q @ k.transpose(-1, -2) * scale + bias).masked_fill(d < 0, -math.inf)
    return torch.softmax(scores, -1) @ v


@given(case())
def test_matches_reference_float32_and_float64(c):
    for dtype, atol in ((torch.float32, 3e-6), (torch.float64, 1e-12)):
        q, k, v = random_qkv(c, dtype)
        r, table = terms(c, dtype)
        want = oracle(q, k, v, r, table, c["scale"])
        got = posenc.banded_attention(q, k, v, r, table, scale=c["scale"], block=c["block"])
        assert got.dtype == dtype
        np.testing.assert_allclose(got.double().numpy(), want, atol=atol, rtol=0)
        via_attention = posenc.attention(q, k, v, bias=posenc.BandedBias(r, table), scale=c["scale"])
        np.testing.assert_allclose(via_attention.double().numpy(), want, atol=atol, rtol=0)


@settings(max_examples=30)
@given(case())
def test_the_bias_is_r_dot_p_in_the_band_and_exactly_zero_beyond_it(c):
    r, table = terms(c, torch.float64)
    got = banded_bias(r, table, c["k_len"])
    want = R.banded_bias(r.numpy(), table.numpy(), c["k_len"])
    np.testing.assert_allclose(got.numpy(), want, atol=1e-13, rtol=0)
    d = torch.arange(c["k_len"] - c["q_len"], c["k_len"])[:, None] - torch.arange(c["k_len"])[None, :]
    outside = (d < 0) | (d >= c["extent"])
    assert bool((got[..., outside] == 0).all())


def test_keys_beyond_the_extent_get_exactly_the_same_weight():
    """With q = 0 and v the identity, the output is the attention weights: every key at distance >= extent has
    bias exactly 0, so all of them share one weight exactly, and keys after the query weigh exactly 0."""
    c = dict(batch=1, heads=2, kv_heads=1, q_len=40, k_len=50, head_dim=4, v_dim=50, d_rel=4, extent=6)
    r, table = terms(dict(c, strength=3.0))
    q = torch.zeros(1, 2, 40, 4)
    k = torch.randn(1, 1, 50, 4)
    v = torch.eye(50)[None, None]
    for block in (None, 7):
        w = posenc.banded_attention(q, k, v, r, table, block=block)  # (1, 2, 40, 50): row a is query 10 + a
        for a in range(40):
            i = 10 + a
            far = w[0, :, a, : i - 5]  # distances i - j >= 6
            assert bool((far == far[:, :1]).all()) and bool((w[0, :, a, i + 1 :] == 0).all())
            near = w[0, :, a, i - 5 : i + 1]
            assert bool((near != far[:, :1]).all())  # the band moves every weight it covers
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 40))


@settings(max_examples=25)
@given(case())
def test_gradients_match_materialised_float64(c):
    q, k, v = random_qkv(c, torch.float64, grad=True)
    r, table = terms(c, torch.float64, grad=True)
    got = posenc.banded_attention(q, k, v, r, table, scale=c["scale"], block=c["block"])
    want = materialised(q, k, v, r, table, c["scale"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert_same_gradients(got, want, [q, k, v, r, table])


@pytest.mark.parametrize("block", [2, None])
def test_gradcheck(block):
    gen = torch.Generator().manual_seed(3)
    shape = dict(batch=1, heads=2, kv_heads=1, q_len=5, k_len=7, head_dim=4, v_dim=3)
    q, k, v = random_qkv(shape, torch.float64, grad=True)
    r = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    table = torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *t: posenc.banded_attention(*t, scale=0.7, block=block), (q, k, v, r, table)
    )


def test_blocked_equals_one_block():
    """Several blocks (and the default sizing, blocked at this length) against one materialised block."""
    c = dict(batch=1, heads=4, kv_heads=2, q_len=300, k_len=320, head_dim=8, v_dim=8, d_rel=4, extent=50)
    q, k, v = random_qkv(c, grad=True)
    r, table = terms(dict(c, strength=2.0), grad=True)
    direct = posenc.banded_attention(q, k, v, r, table, block=300)
    grad = torch.randn(direct.shape, generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(direct, [q, k, v, r, table], grad)
    for block in (None, 64, 7):
        got = posenc.banded_attention(q, k, v, r, table, block=block)
        torch.testing.assert_close(got, direct, rtol=0, atol=2e-6)
        for g, w in zip(torch.autograd.grad(got, [q, k, v, r, table], grad), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class _LargestStorage(TorchDispatchMode):
    """The most elements any tensor an operation returns holds in its storage (views count their base)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


def test_no_tensor_is_larger_than_one_block_of_scores():
    """Forward and backward at L = 1024, 4 heads, extent 1024, d_rel 16, blocks of 64 queries: no tensor holds
    more than one block's (heads, 64, L) scores, so neither (L, L, d_rel) (16.8M per head) nor every row's
    (L, extent) profiles (4.2M) is ever formed."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1024, 16, generator=gen, requires_grad=True) for _ in range(3))
    r = torch.randn(1, 4, 1024, 16, generator=gen, requires_grad=True)
    table = torch.randn(16, 1024, generator=gen, requires_grad=True)
    with _LargestStorage() as seen:
        out = posenc.banded_attention(q, k, v, r, table, block=64)
        torch.autograd.grad(out.sum(), [q, k, v, r, table])
    assert seen.largest == 4 * 64 * 1024, seen.largest  # the scores of a block, seen


def test_memory_stays_linear():
    """Forward and backward at L = 4096, 4 heads, extent 1024, d_rel 16: the peak RSS rise stays far below one
    materialised (heads, L, L) float32 tensor (256 MiB), let alone (heads, L, L, d_rel) (4 GiB)."""
    setup = "table = torch.randn(16, 1024, requires_grad=True)"
    setup += "\nr = lambda q: torch.randn(*q.shape[:3], 16, requires_grad=True)"
    call = "posenc.attention(q, k, v, bias=posenc.BandedBias(r(q), table))"
    rise_mib = peak_rise_mib(setup, call, 4096)
    assert rise_mib < 128, f"peak RSS rose by {rise_mib:.0f} MiB"


def test_decoding_one_query_at_a_time_equals_the_full_pass():
    """With a KV cache the queries are the last q_len positions and r is that of the new queries only."""
    c = dict(batch=2, heads=4, kv_heads=2, q_len=40, k_len=40, head_dim=8, v_dim=8, d_rel=4, extent=9)
    q, k, v = random_qkv(c)
    r, table = terms(dict(c, strength=2.0))
    full = posenc.attention(q, k, v, bias=posenc.BandedBias(r, table))
    for t in (0, 5, 17, 39):
        step = posenc.attention(
            q[:, :, t : t + 1],
            k[:, :, : t + 1],
            v[:, :, : t + 1],
            bias=posenc.BandedBias(r[:, :, t : t + 1], table),
        )
        torch.testing.assert_close(step, full[:, :, t : t + 1], rtol=0, atol=1e-6)
    chunk = posenc.attention(q[:, :, 30:], k, v, bias=posenc.BandedBias(r[:, :, 30:], table))
    torch.testing.assert_close(chunk, full[:, :, 30:], rtol=0, atol=1e-6)


def test_large_biases_give_no_nan():
    """Profiles of +-1e4: rows dominated by the band; values and gradients finite."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 600, 8, generator=gen, requires_grad=True) for _ in range(3))
    r = (1e3 * torch.randn(1, 2, 600, 4, generator=gen)).requires_grad_()
    table = (10 * torch.randn(4, 16, generator=gen)).requires_grad_()
    out = posenc.attention(q, k, v, bias=posenc.BandedBias(r, table))
    grads = torch.autograd.grad(out.sum(), [q, k, v, r, table])
    assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(g).all()) for g in grads)


def test_rotary_applies_before_the_bias():
    rope = posenc.RotaryEmbedding(8)
    c = dict(batch=1, heads=2, kv_heads=2, q_len=20, k_len=20, head_dim=8, v_dim=8, d_rel=3, extent=6)
    q, k, v = random_qkv(c)
    r, table = terms(dict(c, strength=1.0))
    rq, rk = rope(q, k)
    torch.testing.assert_close(
        posenc.attention(q, k, v, rotary=rope, bias=posenc.BandedBias(r, table)),
        posenc.banded_attention(rq, rk, v, r, table),
        rtol=0,
        atol=1e-6,
    )


def test_banded_relative_is_inklings_layer():
    """r = x W^T split per head, (batch, heads, seq, d_rel); W (heads * d_rel, d_model) without a bias and
    P (d_rel, extent), both N(0, 0.02^2)."""
    torch.manual_seed(0)
    rel = posenc.BandedRelative(256, 8, d_rel=16, extent=512)
    assert rel.proj.bias is None and tuple(rel.proj.weight.shape) == (128, 256)
    assert tuple(rel.table.shape) == (16, 512)
    for w in (rel.proj.weight, rel.table):
        assert abs(w.std().item() - 0.02) < 1e-3 and abs(w.mean().item()) < 1e-3
    x = torch.randn(2, 7, 256, generator=torch.Generator().manual_seed(1))
    r = rel(x).rel_states
    assert rel(x).rel_table is rel.table
    torch.testing.assert_close(rel.states(x), r, rtol=0, atol=0)
    want = (x @ rel.proj.weight.T).reshape(2, 7, 8, 16).transpose(1, 2)
    assert r.shape == (2, 8, 7, 16)
    torch.testing.assert_close(r, want)


def test_errors_name_the_argument_and_value():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    r, table = torch.zeros(1, 4, 5, 3), torch.zeros(3, 6)
    cases = [
        (
            dict(bias=posenc.BandedBias(torch.zeros(1, 2, 5, 3), table)),
            r"rel_states must have shape \(batch, heads, q_len, d_rel\) = \(1, 4, 5, 3\).*got \(1, 2, 5, 3\)",
        ),
        (
            dict(bias=posenc.BandedBias(torch.zeros(1, 4, 5, 4), table)),
            r"rel_states must have shape .* = \(1, 4, 5, 3\).*got \(1, 4, 5, 4\)",
        ),
        (
            dict(bias=posenc.BandedBias(r.long(), table)),
            r"rel_states must be a float tensor .*got torch.int64",
        ),
        (dict(bias=posenc.BandedBias(r, [[0.0]])), r"rel_table must be a float tensor .*got list"),
        (dict(bias=posenc.BandedBias(r, torch.zeros(3))), r"rel_table must be a float tensor .*got \(3,\)"),
        (
            dict(bias=posenc.BandedBias(r, torch.zeros(3, 0))),
            r"rel_table must have d_rel >= 1 rows and extent >= 1 columns .*got shape \(3, 0\)",
        ),
        (
            dict(bias=posenc.BandedBias(r.clone().index_fill_(2, torch.tensor([3]), math.nan), table)),
            "rel_states must be finite, got nan",
        ),
        (
            dict(bias=posenc.BandedBias(r, table.clone().fill_(math.inf))),
            "rel_table must be finite, got inf",
        ),
        (dict(bias=posenc.BandedBias(r, table), causal=False), "BandedBias works with causal attention only"),
        (
            dict(bias=posenc.BandedBias(r, table), sinks=torch.zeros(4)),
            r"sinks= takes no bias \(got BandedBias\)",
        ),
        (dict(bias=posenc.BandedBias(r, table), scale=-1.0), "scale must be .*got -1.0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            posenc.attention(q, k, k, **kwargs)
    for kwargs, message in [
        (dict(extent=0), "extent must be an integer >= 1, got 0"),
        (dict(d_rel=0), "d_rel must be an integer >= 1, got 0"),
        (dict(extent=2.5), "extent must be an integer >= 1, got 2.5"),
    ]:
        with pytest.raises(ValueError, match=message):
            posenc.BandedRelative(16, 4, **kwargs)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, 16\), got \(2, 5, 8\)"):
        posenc.BandedRelative(16, 4)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"block must be an integer >= 1, got 0"):
        posenc.banded_attention(q, k, k, r, table, block=0)
