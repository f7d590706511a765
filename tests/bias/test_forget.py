"""Forgetting Attention (FoX, Lin et al. 2025) against posenc.reference.forgetting_attention (values, float32
and float64, short and long with strong forgetting) and a plain-torch attention that materialises
(batch, heads, L, L) (values and gradients); the blocked path against one block; memory, decoding with
q_len < k_len, extreme gates, the gate module, torch.compile and errors."""

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
from .oracles import assert_same_gradients


@st.composite
def case(draw):
    return dict(
        draw_shapes(draw),
        strength=draw(st.sampled_from([0.0, 0.1, 1.0, 5.0, 30.0])),  # mean |log f|
        block=draw(st.one_of(st.none(), st.integers(1, 8))),
        scale=draw(st.sampled_from([None, 0.7])),
    )


def gates(c, dtype=torch.float32, grad=False, seed=5):
    """(batch, heads, k_len) log-gates around -strength: logsigmoid of a logit drawn near the gate whose log
    is -strength (0: every gate exactly 1)."""
    shape = (c["batch"], c["heads"], c["k_len"])
    if c["strength"] == 0:
        return torch.zeros(shape, dtype=dtype, requires_grad=grad)
    logit = -math.log(math.expm1(c["strength"]))  # logsigmoid(logit) = -strength
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return F.logsigmoid(logit + noise).detach().requires_grad_(grad)


def oracle(q, k, v, log_f, scale=None):
    g = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(t.detach().double().numpy(), g, axis=1) for t in (k, v))
    return R.forgetting_attention(q.detach().double().numpy(), kk, vv, log_f.detach().double().numpy(), scale)


def materialised(q, k, v, log_f, scale=None):
    """The (batch, heads, q_len, k_len) decay bias c_i - c_j and a softmax over it, all in plain torch."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    lq, lk = q.shape[2], k.shape[2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    c = log_f.cumsum(-1)
    bias = c[..., lk - lq :, None] - c[..., None, :]
    future = torch.arange(lk)[None, :] > torch.arange(lk - lq, lk)[:, None]
    scores = (q @ k.transpose(-1, -2) * scale + bias).masked_fill(future, -math.inf)
    return torch.softmax(scores, -1) @ v


@given(case())
def test_matches_reference_float32_and_float64(c):
    for dtype, atol in ((torch.float32, 3e-6), (torch.float64, 1e-12)):
        q, k, v = random_qkv(c, dtype)
        log_f = gates(c, dtype)
        want = oracle(q, k, v, log_f, c["scale"])
        got = posenc.forgetting_attention(q, k, v, log_f, scale=c["scale"], block=c["block"])
        assert got.dtype == dtype
        np.testing.assert_allclose(got.double().numpy(), want, atol=atol, rtol=0)
        via_attention = posenc.attention(q, k, v, bias=posenc.ForgetBias(log_f), scale=c["scale"])
        np.testing.assert_allclose(via_attention.double().numpy(), want, atol=atol, rtol=0)


@pytest.mark.parametrize("strength", [1.0, 30.0, "mixed"])
def test_long_sequences_with_strong_forgetting_match_the_reference_in_float32(strength):
    """At L = 2048 c reaches 2048 |log f| (6e4 at 30): float32 differences of c would be off by ~1e-3."""
    c = dict(batch=1, heads=2, kv_heads=1, q_len=2048, k_len=2048, head_dim=16, v_dim=16, strength=1.0)
    q, k, v = random_qkv(c)
    if strength == "mixed":  # gates from 0.02 to 1: spans that forget and spans that keep everything
        log_f = F.logsigmoid(4 * torch.randn(1, 2, 2048, generator=torch.Generator().manual_seed(9)))
    else:
        log_f = gates(dict(c, strength=strength))
    got = posenc.attention(q, k, v, bias=posenc.ForgetBias(log_f))
    np.testing.assert_allclose(got.double().numpy(), oracle(q, k, v, log_f), atol=2e-6, rtol=0)


@settings(max_examples=25)
@given(case())
def test_gradients_match_materialised_float64(c):
    q, k, v = random_qkv(c, torch.float64, grad=True)
    log_f = gates(c, torch.float64, grad=True)
    got = posenc.forgetting_attention(q, k, v, log_f, scale=c["scale"], block=c["block"])
    want = materialised(q, k, v, log_f, c["scale"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert_same_gradients(got, want, [q, k, v, log_f])


@pytest.mark.parametrize("block", [2, None])
def test_gradcheck(block):
    gen = torch.Generator().manual_seed(3)
    shape = dict(batch=1, heads=2, kv_heads=1, q_len=5, k_len=7, head_dim=4, v_dim=3)
    q, k, v = random_qkv(shape, torch.float64, grad=True)
    logit = torch.randn(1, 2, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, logit: posenc.forgetting_attention(
            q, k, v, F.logsigmoid(logit), scale=0.7, block=block
        ),
        (q, k, v, logit),
    )


def test_blocked_equals_one_block():
    """Several blocks (and the default sizing, blocked at this length) against one materialised block."""
    c = dict(batch=1, heads=4, kv_heads=2, q_len=300, k_len=320, head_dim=8, v_dim=8, strength=0.3)
    q, k, v = random_qkv(c, grad=True)
    log_f = gates(c, grad=True)
    direct = posenc.forgetting_attention(q, k, v, log_f, block=300)
    grad = torch.randn(direct.shape, generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(direct, [q, k, v, log_f], grad)
    for block in (None, 64, 7):
        got = posenc.forgetting_attention(q, k, v, log_f, block=block)
        torch.testing.assert_close(got, direct, rtol=0, atol=2e-6)
        for g, w in zip(torch.autograd.grad(got, [q, k, v, log_f], grad), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_memory_stays_linear():
    """Forward and backward at L = 4096, 4 heads: the peak RSS rise stays far below one materialised
    (heads, L, L) float32 tensor (256 MiB)."""
    setup = "gate = lambda q: torch.nn.functional.logsigmoid(torch.ones(q.shape[:3], requires_grad=True))"
    rise_mib = peak_rise_mib(setup, "posenc.attention(q, k, v, bias=posenc.ForgetBias(gate(q)))", 4096)
    assert rise_mib < 128, f"peak RSS rose by {rise_mib:.0f} MiB"


def test_decoding_one_query_at_a_time_equals_the_full_pass():
    """With a KV cache the queries are the last q_len positions and the gates are those of every key."""
    c = dict(batch=2, heads=4, kv_heads=2, q_len=40, k_len=40, head_dim=8, v_dim=8, strength=1.0)
    q, k, v = random_qkv(c)
    log_f = gates(c)
    full = posenc.attention(q, k, v, bias=posenc.ForgetBias(log_f))
    for t in (1, 17, 39):
        step = posenc.attention(
            q[:, :, t : t + 1],
            k[:, :, : t + 1],
            v[:, :, : t + 1],
            bias=posenc.ForgetBias(log_f[..., : t + 1]),
        )
        torch.testing.assert_close(step, full[:, :, t : t + 1], rtol=0, atol=1e-6)
    chunk = posenc.attention(q[:, :, 30:], k, v, bias=posenc.ForgetBias(log_f))
    torch.testing.assert_close(chunk, full[:, :, 30:], rtol=0, atol=1e-6)


def test_extreme_gates_give_no_nan():
    """log f = -30 everywhere: every query reads its own value (exp(-30) of the rest); log f = 0: plain causal
    attention. Values and gradients finite, at a length where far scores underflow to exactly 0."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 600, 8, generator=gen, requires_grad=True) for _ in range(3))
    shut = torch.full((1, 2, 600), -30.0, requires_grad=True)
    out = posenc.attention(q, k, v, bias=posenc.ForgetBias(shut))
    torch.testing.assert_close(out, v, rtol=0, atol=1e-11 * v.abs().max().item() * 100)
    open_ = torch.zeros(1, 2, 600, requires_grad=True)
    plain = posenc.attention(q, k, v, bias=posenc.ForgetBias(open_))
    torch.testing.assert_close(
        plain, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=2e-6
    )
    grads = torch.autograd.grad((out.sum() + plain.sum()), [q, k, v, shut, open_])
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert bool(
        torch.isfinite(
            posenc.attention(q, k, v, bias=posenc.ForgetBias(torch.full((1, 2, 600), -1e30)))
        ).all()
    )


def test_rotary_applies_before_the_decay():
    rope = posenc.RotaryEmbedding(8)
    c = dict(batch=1, heads=2, kv_heads=2, q_len=20, k_len=20, head_dim=8, v_dim=8, strength=0.5)
    q, k, v = random_qkv(c)
    log_f = gates(c)
    rq, rk = rope(q, k)
    torch.testing.assert_close(
        posenc.attention(q, k, v, rotary=rope, bias=posenc.ForgetBias(log_f)),
        posenc.forgetting_attention(rq, rk, v, log_f),
        rtol=0,
        atol=1e-6,
    )


def test_forget_gate_is_the_authors_layer():
    """logsigmoid(x W^T + b) per head, transposed to (batch, heads, seq); weights N(0, 0.02^2), bias 0."""
    torch.manual_seed(0)
    gate = posenc.ForgetGate(256, 64)
    assert bool((gate.proj.bias == 0).all())
    assert abs(gate.proj.weight.std().item() - 0.02) < 1e-3 and abs(gate.proj.weight.mean().item()) < 1e-3
    x = torch.randn(2, 7, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gate.proj.bias.normal_()
    got = gate(x).log_forget
    torch.testing.assert_close(gate.log_gates(x), got, rtol=0, atol=0)
    w, b = gate.proj.weight.detach().double().numpy(), gate.proj.bias.detach().double().numpy()
    logit = x.double().numpy() @ w.T + b
    want = -np.log1p(np.exp(-logit)).transpose(0, 2, 1)
    assert got.shape == (2, 64, 7) and got.dtype == torch.float32 and bool((got <= 0).all())
    np.testing.assert_allclose(got.detach().double().numpy(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("seq", [12, 300])
def test_torch_compile_matches_eager(seq):
    """The one-block path (12) is traced; the blocked path (300) runs eagerly behind a graph break."""
    torch._dynamo.reset()
    c = dict(batch=1, heads=4, kv_heads=2, q_len=seq, k_len=seq, head_dim=8, v_dim=8, strength=0.5)
    q, k, v = random_qkv(c, grad=True)
    logit = torch.randn(1, 4, seq, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def loss(q, k, v, logit):
        return posenc.attention(q, k, v, bias=posenc.ForgetBias(F.logsigmoid(logit))).square().sum()

    params = [q, k, v, logit]
    got = torch.compile(loss, backend="aot_eager")(*params)
    want = loss(*params)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for g, w in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_errors_name_the_argument_and_value():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    ok = torch.full((1, 4, 5), -0.5)
    cases = [
        (
            dict(bias=posenc.ForgetBias(torch.full((1, 4, 5), 0.25))),
            r"log_forget must be <= 0 \(the log of a gate in \(0, 1\]\), got 0.25",
        ),
        (
            dict(bias=posenc.ForgetBias(ok.clone().index_fill_(2, torch.tensor([3]), math.nan))),
            "log_forget must be finite.*got nan",
        ),
        (
            dict(bias=posenc.ForgetBias(ok.clone().index_fill_(2, torch.tensor([3]), -math.inf))),
            "log_forget must be finite.*got -inf",
        ),
        (
            dict(bias=posenc.ForgetBias(torch.zeros(1, 2, 5))),
            r"log_forget must have shape \(batch, heads, k_len\) = \(1, 4, 5\).*got \(1, 2, 5\)",
        ),
        (
            dict(bias=posenc.ForgetBias(torch.zeros(1, 4, 5, dtype=torch.long))),
            r"log_forget must be a float tensor.*got torch.int64",
        ),
        (dict(bias=posenc.ForgetBias([0.0] * 5)), "log_forget must be a float tensor.*got list"),
        (dict(bias=posenc.ForgetBias(ok), causal=False), "ForgetBias works with causal attention only"),
        (dict(bias=posenc.ForgetBias(ok), sinks=torch.zeros(4)), r"sinks= takes no bias \(got ForgetBias\)"),
        (dict(bias=posenc.ForgetBias(ok), scale=-1.0), "scale must be .*got -1.0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            posenc.attention(q, k, k, **kwargs)
    with pytest.raises(ValueError, match="d_model must be an integer >= 1, got 0"):
        posenc.ForgetGate(0, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, 16\), got \(2, 5, 8\)"):
        posenc.ForgetGate(16, 4)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"block must be an integer >= 1, got 0"):
        posenc.forgetting_attention(q, k, k, ok, block=0)
