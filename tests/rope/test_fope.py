"""FoPE (Hua et al. 2024, arxiv.org/abs/2412.17739) against posenc.reference (fope, fope_frequencies): the
floor, the series per pair and head, positions / offset / grouped heads, attention through
posenc.attention(rotary=), gradients, and the arguments it refuses."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import FoPE
from posenc import reference as R


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _fope(head_dim=8, heads=2, train_len=64, seed=0, **kw):
    return FoPE(head_dim, heads, train_len=train_len, generator=torch.Generator().manual_seed(seed), **kw)


@st.composite
def cases(draw):
    head_dim = draw(st.sampled_from([2, 4, 8, 12]))
    heads, batch = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    k_len = draw(st.integers(1, 6))
    kind = draw(st.sampled_from(["default", "offset", "positions", "batched"]))
    q_len = draw(st.integers(1, k_len)) if kind in ("default", "offset") else k_len
    module = dict(
        train_len=draw(st.sampled_from([4, 16, 64, 5000])),
        base=draw(st.sampled_from([100.0, 10000.0])),
        fourier_dim=head_dim * draw(st.sampled_from([1, 2])),
        sigma=draw(st.sampled_from([0.0, 0.3, 1.0])),
        layout=draw(st.sampled_from(["interleaved", "half"])),
    )
    return head_dim, heads, batch, q_len, k_len, kind, module


@given(cases(), st.sampled_from([torch.float64, torch.float32]))
def test_forward_matches_reference(case, dtype):
    head_dim, heads, batch, q_len, k_len, kind, kw = case
    fope = _fope(head_dim, heads, seed=head_dim + k_len, **kw)
    rng = np.random.default_rng(head_dim * 10 + k_len)
    q = torch.from_numpy(rng.normal(size=(batch, heads, q_len, head_dim))).to(dtype)
    k = torch.from_numpy(rng.normal(size=(batch, heads, k_len, head_dim))).to(dtype)
    offset, positions = 0, None
    if kind == "offset":
        offset = 700
    kp = offset + np.arange(k_len)
    if kind == "positions":
        kp = rng.uniform(0, 3000, size=k_len)
    elif kind == "batched":
        kp = rng.integers(0, 3000, size=(batch, k_len))
    if kind in ("positions", "batched"):
        positions = torch.from_numpy(kp)
    got_q, got_k = fope(q, k, positions=positions, offset=offset)
    qp = kp[..., k_len - q_len :]
    ref = dict(cos_coef=fope.cos_coef, sin_coef=fope.sin_coef, train_len=kw["train_len"], base=kw["base"])
    ref.update(fourier_dim=kw["fourier_dim"], layout=kw["layout"])
    tol = 1e-10 if dtype == torch.float64 else 3e-5
    assert got_q.dtype == dtype and got_k.dtype == dtype
    np.testing.assert_allclose(got_q.double().numpy(), R.fope(q, qp, **ref), rtol=tol, atol=tol)
    np.testing.assert_allclose(got_k.double().numpy(), R.fope(k, kp, **ref), rtol=tol, atol=tol)


def test_the_floor_is_one_period_in_the_training_length():
    # head_dim 8, base 10^4: frequencies 1, 0.1, 0.01, 0.001. 0.1 has period 62.83: it completes one in 63
    # positions and not in 62, so it is kept at L = 63 and clipped to zero at L = 62.
    for train_len, kept in ((63, 2), (62, 1), (6, 0), (7, 1)):
        freqs, series = R.fope_frequencies(8, 10000.0, train_len)
        assert series.sum() == kept == len(freqs)
        assert FoPE(8, 1, train_len=train_len).active == kept
        np.testing.assert_allclose(FoPE(8, 1, train_len=train_len).frequencies.numpy(), freqs, rtol=1e-15)
    freqs, series = R.fope_frequencies(8, 10000.0, 63, fourier_dim=16)  # 1, 10^-0.5, 0.1, 10^-1.5, ...
    assert len(freqs) == 3 and series.sum() == 2 and math.isclose(freqs[2], 0.1)


def test_without_noise_fope_is_rope_with_the_low_frequencies_clipped_to_zero():
    q, k = _randn(2, 3, 5, 16), _randn(2, 3, 9, 16, seed=1)
    fope = _fope(16, 3, train_len=100, sigma=0.0, base=10000.0)
    inv = R.inverse_frequencies(16, 10000.0)
    clipped = np.where(inv >= 2 * math.pi / 100, inv, 0.0)
    assert (clipped == 0).sum() == 5  # 10^(-m/2) < 2 pi / 100 for m >= 3
    got_q, got_k = fope(q, k)
    np.testing.assert_allclose(got_q.numpy(), R.rope(q, np.arange(4, 9), inv_freq=clipped), atol=1e-12)
    np.testing.assert_allclose(got_k.numpy(), R.rope(k, np.arange(9), inv_freq=clipped), atol=1e-12)


def test_the_noise_makes_a_scaled_rotation_the_same_for_queries_and_keys():
    fope = _fope(8, 2, train_len=64, sigma=1.0)  # frequencies 1 and 0.1 carry series; 0.01, 0.001 clipped
    x = _randn(1, 2, 12, 8)
    cos, sin = fope.cos_sin(torch.arange(12))
    assert cos.shape == sin.shape == (2, 12, 4) and cos.dtype == torch.float32
    amplitude = cos.double() ** 2 + sin.double() ** 2
    assert (amplitude[..., :2] - 1).abs().max() > 1e-3  # not a pure rotation
    assert torch.equal(amplitude[..., 2:], torch.ones(2, 12, 2, dtype=torch.float64))  # the clipped pairs
    assert torch.equal(cos[:, 0], torch.ones(2, 4)) and torch.equal(sin[:, 0], torch.zeros(2, 4))  # p = 0
    q, k = fope(x, x)
    assert torch.equal(q, k) and torch.equal(q, fope.rotate(x))


def test_attention_through_fope_equals_reference_attention():
    fope = _fope(8, 2, train_len=16, sigma=0.5)
    q, k, v = _randn(2, 2, 3, 8), _randn(2, 2, 7, 8, seed=1), _randn(2, 2, 7, 5, seed=2)
    got = posenc.attention(q, k, v, rotary=fope, causal=True)
    ref = dict(cos_coef=fope.cos_coef, sin_coef=fope.sin_coef, train_len=16)
    want = R.attention(R.fope(q, np.arange(4, 7), **ref), R.fope(k, np.arange(7), **ref), v, causal=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_grouped_query_heads_share_their_key_heads_coefficients():
    fope = _fope(8, 2, train_len=32, sigma=0.5)
    q, k = _randn(1, 4, 5, 8), _randn(1, 2, 5, 8, seed=1)
    got_q, _ = fope(q, k)
    ref = dict(train_len=32)
    cos4, sin4 = (c.repeat_interleave(2, 0) for c in (fope.cos_coef, fope.sin_coef))
    want = R.fope(q, np.arange(5), cos_coef=cos4, sin_coef=sin4, **ref)
    np.testing.assert_allclose(got_q.numpy(), want, rtol=1e-10, atol=1e-12)


def test_gradients_flow_to_q_k_and_learnable_coefficients():
    fope = _fope(4, 1, train_len=16, sigma=0.5, learnable=True).double()
    assert [n for n, p in fope.named_parameters()] == ["cos_coef", "sin_coef"]
    q, k = _randn(1, 1, 3, 4).requires_grad_(), _randn(1, 1, 4, 4, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: fope(q, k), (q, k))
    coefs = tuple(p.detach().clone().requires_grad_() for p in (fope.cos_coef, fope.sin_coef))

    def through(c, s):
        return torch.func.functional_call(fope, {"cos_coef": c, "sin_coef": s}, (q.detach(), k.detach()))

    assert torch.autograd.gradcheck(through, coefs)
    fixed = _fope(4, 1, train_len=16)
    assert list(fixed.parameters()) == [] and sorted(dict(fixed.named_buffers())) == ["cos_coef", "sin_coef"]


def test_the_coefficients_are_drawn_from_the_generator_and_kept_in_the_state_dict():
    a, b, c = _fope(seed=3), _fope(seed=3), _fope(seed=4)
    assert torch.equal(a.cos_coef, b.cos_coef) and not torch.equal(a.cos_coef, c.cos_coef)
    assert not torch.equal(a.cos_coef, a.sin_coef)  # separate cosine and sine coefficients
    assert not torch.equal(a.cos_coef[0], a.cos_coef[1])  # separate per head
    c.load_state_dict(a.state_dict())
    x = _randn(1, 2, 6, 8)
    assert torch.equal(c.rotate(x), a.rotate(x))
    # the noise's spread is xavier_normal_'s for (heads, D, M'): sigma * sqrt(2 / ((D + heads) M'))
    big = FoPE(64, 8, train_len=512, sigma=0.3, generator=torch.Generator().manual_seed(0))
    noise = big.cos_coef - big.cos_coef.round()
    assert big.cos_coef.shape == (8, 16, 16)
    assert abs(float(noise.std()) / (0.3 * math.sqrt(2 / (24 * 16))) - 1) < 0.1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_dim=7), r"head_dim"),
        (dict(heads=0), r"heads"),
        (dict(train_len=0), r"train_len"),
        (dict(sigma=-0.1), r"sigma"),
        (dict(sigma=float("nan")), r"sigma"),
        (dict(fourier_dim=12), r"fourier_dim=12 must be a multiple of head_dim=8"),
        (dict(layout="pairs"), r"layout"),
        (dict(sigma=1e4), r"sigma=10000 is too large for 2 frequencies and 2 pairs"),
    ],
)
def test_bad_arguments_are_refused_with_their_names(kwargs, match):
    args = dict(head_dim=8, heads=2, train_len=64) | kwargs
    with pytest.raises(ValueError, match=match):
        FoPE(args.pop("head_dim"), args.pop("heads"), **args)


def test_bad_inputs_are_refused_with_their_names():
    fope = _fope(8, 2)
    with pytest.raises(ValueError, match=r"x has 3 heads; this FoPE has coefficients for heads=2"):
        fope.rotate(_randn(1, 3, 4, 8))
    with pytest.raises(ValueError, match=r"last dimension head_dim=8"):
        fope.rotate(_randn(1, 2, 4, 6))
    with pytest.raises(ValueError, match=r"positions must be a torch.Tensor"):
        fope.cos_sin([0, 1])
    with pytest.raises(ValueError, match=r"offset"):
        fope.rotate(_randn(1, 2, 4, 8), offset=-1)
