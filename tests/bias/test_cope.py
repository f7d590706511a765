"""CoPE (Golovneva et al. 2024) against posenc.reference.cope_attention (values), a plain-torch attention
written after the reference code's ``ContextPosSelfAttn`` that materialises (heads, L, L) (values and
gradients), and causal SDPA at its zero initialisation; the query-blocked kernel against its own one-block
path; memory, torch.compile and errors."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as R

from ..peak_memory import peak_rise_mib
from ..qkv import draw_shapes, random_qkv


@st.composite
def case(draw):
    return dict(
        draw_shapes(draw),
        npos_max=draw(st.integers(1, 30)),  # below k_len the counts are clamped
        block=draw(st.one_of(st.none(), st.integers(1, 8))),
        scale=draw(st.sampled_from([None, 0.7])),
    )


def _module(c, dtype=torch.float32):
    cope = posenc.CoPE(c["head_dim"], c["npos_max"]).to(dtype)
    with torch.no_grad():
        cope.pos_emb.copy_(torch.randn(cope.pos_emb.shape, generator=torch.Generator().manual_seed(7)))
    return cope


def _materialised(q, k, v, cope, scale=None):
    """The reference code's forward (default flags: gates from q.k, division after adding the position
    logits), on (batch, heads, L, L) tensors, with the causal mask as a multiplicative 0/1 mask."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    lq, lk = q.shape[2], k.shape[2]
    div = 1 / (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    attn_mask = (torch.arange(lk)[None, :] <= torch.arange(lk - lq, lk)[:, None]).to(q.dtype)
    gate_logits = q @ k.transpose(-1, -2)
    gates = torch.sigmoid(gate_logits / div) * attn_mask
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=cope.npos_max - 1)
    pos_logits_fixed = q @ cope.pos_emb
    positions_ceil, positions_floor = positions.ceil().long(), positions.floor().long()
    pos_logits_ceil = pos_logits_fixed.gather(-1, positions_ceil)
    pos_logits_floor = pos_logits_fixed.gather(-1, positions_floor)
    pos_ceil_weight = positions - positions_floor
    pos_logits = pos_logits_ceil * pos_ceil_weight + pos_logits_floor * (1 - pos_ceil_weight)
    attn_logits = (gate_logits + pos_logits) / div + attn_mask.log()
    return torch.softmax(attn_logits, dim=-1) @ v


def _oracle(q, k, v, cope, scale=None):
    g = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(t.detach().double().numpy(), g, axis=1) for t in (k, v))
    return R.cope_attention(q, kk, vv, cope.pos_emb, scale)


@given(case())
def test_matches_reference_float32(c):
    q, k, v = random_qkv(c)
    cope = _module(c)
    got = cope.attend(q, k, v, scale=c["scale"], block=c["block"])
    want = _oracle(q, k, v, cope, c["scale"])
    np.testing.assert_allclose(got.detach().double().numpy(), want, atol=3e-5, rtol=0)
    via_attention = posenc.attention(q, k, v, bias=cope, scale=c["scale"])
    np.testing.assert_allclose(via_attention.detach().double().numpy(), want, atol=3e-5, rtol=0)


@settings(max_examples=25)
@given(case())
def test_gradients_match_materialised_float64(c):
    q, k, v = random_qkv(c, torch.float64, grad=True)
    cope = _module(c, torch.float64)
    got = cope.attend(q, k, v, scale=c["scale"], block=c["block"])
    want = _materialised(q, k, v, cope, c["scale"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    params = [q, k, v, cope.pos_emb]
    grad = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("npos_max", [3, 20])
def test_gradcheck(npos_max):
    """With npos_max 3 most counts are clamped (no gradient through the count), with 20 none is."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    cope = posenc.CoPE(4, npos_max).double()
    with torch.no_grad():
        cope.pos_emb.normal_(generator=gen)
    assert torch.autograd.gradcheck(
        lambda q, k, v, pos_emb: cope.attend(q, k, v, scale=0.7, block=2), (q, k, v, cope.pos_emb)
    )


def test_zero_initialisation_is_causal_attention():
    """pos_emb starts at zero (the reference's init): no position term, plain causal SDPA."""
    cope = posenc.CoPE(8, 65)
    assert bool((cope.pos_emb == 0).all()) and cope.pos_emb.shape == (8, 65)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 40, 8, generator=gen) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(posenc.attention(q, k, v, bias=cope), want, rtol=0, atol=2e-6)


def test_blocked_equals_one_block():
    """Several blocks (and the default sizing, blocked at this length) against one materialised block."""
    c = dict(batch=1, heads=4, kv_heads=2, q_len=300, k_len=320, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, grad=True)
    cope = _module(dict(c, npos_max=64))
    direct = cope.attend(q, k, v, block=300)
    grad = torch.randn(direct.shape, generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(direct, [q, k, v, cope.pos_emb], grad)
    assert posenc.attention(q, k, v, bias=cope).requires_grad
    for block in (None, 64, 7):
        got = cope.attend(q, k, v, block=block)
        torch.testing.assert_close(got, direct, rtol=0, atol=2e-6)
        for g, w in zip(torch.autograd.grad(got, [q, k, v, cope.pos_emb], grad), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_memory_stays_linear():
    """Forward and backward at L = 4096, 4 heads: the peak RSS rise stays far below one materialised
    (heads, L, L) float32 tensor (256 MiB; the reference code holds about ten of them)."""
    setup = "bias = posenc.CoPE(16, 4097)"
    rise_mib = peak_rise_mib(setup, "posenc.attention(q, k, v, bias=bias)", 4096)
    assert rise_mib < 128, f"peak RSS rose by {rise_mib:.0f} MiB"


@pytest.mark.parametrize("seq", [12, 300])
def test_torch_compile_matches_eager(seq):
    """The one-block path (12) is traced; the blocked path (300) runs eagerly behind a graph break."""
    torch._dynamo.reset()
    c = dict(batch=1, heads=4, kv_heads=2, q_len=seq, k_len=seq, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, grad=True)
    cope = _module(dict(c, npos_max=32))

    def loss(q, k, v):
        return posenc.attention(q, k, v, bias=cope).square().sum()

    params = [q, k, v, cope.pos_emb]
    got = torch.compile(loss, backend="aot_eager")(q, k, v)
    want = loss(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for g, w in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_errors_name_the_argument():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="npos_max must be an integer >= 1, got 0"):
        posenc.CoPE(8, 0)
    with pytest.raises(ValueError, match="head_dim must be an integer >= 1, got 0"):
        posenc.CoPE(0, 8)
    with pytest.raises(ValueError, match="CoPE is causal only.*got causal=False"):
        posenc.attention(q, k, k, bias=posenc.CoPE(8, 8), causal=False)
    with pytest.raises(ValueError, match="q has last dimension 8, but CoPE was built for 16"):
        posenc.attention(q, k, k, bias=posenc.CoPE(16, 8))
    with pytest.raises(ValueError, match="causal attention needs q_len <= k_len"):
        posenc.attention(q, k[:, :, :3], k[:, :, :3], bias=posenc.CoPE(8, 8))
    with pytest.raises(ValueError, match="k and v must have the same batch, heads and length"):
        posenc.attention(q, k, k[:, :, :4], bias=posenc.CoPE(8, 8))
