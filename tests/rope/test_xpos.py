"""XPos and blockwise_causal_mask against posenc.reference (xpos, blockwise_causal_mask), torchscale's
procedure written out in plain torch, and a materialised plain-torch attention (values and gradients)."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import XPos, blockwise_causal_mask
from posenc import reference as R

warnings.filterwarnings("ignore", module="torch._inductor")

TOL = {torch.float64: 1e-10, torch.float32: 3e-5}


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _midpoint_up(p: np.ndarray) -> np.ndarray:
    """The default centre as documented: the middle of the key positions, rounded up (per sequence)."""
    return np.ceil((p.min(-1) + p.max(-1)) / 2)


@st.composite
def cases(draw):
    head_dim = draw(st.sampled_from([2, 4, 8, 16]))
    rotary_dim = draw(st.sampled_from([d for d in (2, 4, 8, 16) if d <= head_dim]))
    batch, heads = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    k_len = draw(st.integers(1, 9))
    kind = draw(st.sampled_from(["default", "offset", "integer", "fractional", "batched"]))
    q_len = draw(st.integers(1, k_len)) if kind in ("default", "offset") else k_len
    centre = draw(st.sampled_from(["default", "number", "per-sequence"]))
    return head_dim, rotary_dim, batch, heads, q_len, k_len, kind, centre


@given(cases(), st.sampled_from([torch.float64, torch.float32]), st.sampled_from(["interleaved", "half"]))
def test_forward_matches_reference(case, dtype, layout):
    head_dim, rotary_dim, batch, heads, q_len, k_len, kind, centre_kind = case
    rng = np.random.default_rng(head_dim * 100 + k_len * 10 + q_len)
    q = torch.from_numpy(rng.normal(size=(batch, heads, q_len, head_dim))).to(dtype)
    k = torch.from_numpy(rng.normal(size=(batch, heads, k_len, head_dim))).to(dtype)
    positions, offset = None, 0
    if kind == "default":
        kp = np.arange(k_len)
    elif kind == "offset":
        offset, kp = 300, 300 + np.arange(k_len)
    elif kind == "integer":
        kp = rng.integers(0, 3000, size=k_len)
    elif kind == "fractional":
        kp = rng.uniform(0, 3000, size=k_len)
    else:
        kp = rng.integers(0, 3000, size=(batch, k_len))
    if kind not in ("default", "offset"):
        positions = torch.from_numpy(kp)
    qp = kp[..., k_len - q_len :]
    if centre_kind == "default":
        centre, ref_centre = None, _midpoint_up(kp)
    elif centre_kind == "number":
        centre = ref_centre = 1234.5
    else:
        ref_centre = rng.uniform(0, 3000, size=batch)
        centre = torch.from_numpy(ref_centre)
    xpos = XPos(head_dim, rotary_dim=rotary_dim, layout=layout, scale_base=256, gamma=0.3)
    qo, ko = xpos(q, k, positions=positions, offset=offset, centre=centre)
    assert qo.dtype == ko.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    kw = dict(scale_base=256, gamma=0.3, layout=layout, rotary_dim=rotary_dim)
    for got, x, p, what in ((qo, q, qp, "q"), (ko, k, kp, "k")):
        want = R.xpos(x.double().numpy(), p, what, ref_centre, **kw)
        scale = max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=TOL[dtype] * scale)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotate_is_the_query_or_key_half_of_forward(layout):
    xpos = XPos(8, layout=layout)
    q, k = _randn(2, 2, 5, 8), _randn(2, 2, 5, 8, seed=1)
    qo, ko = xpos(q, k, offset=40, centre=17)
    torch.testing.assert_close(xpos.rotate(q, offset=40, kind="q", centre=17), qo, rtol=0, atol=1e-12)
    torch.testing.assert_close(xpos.rotate(k, offset=40, kind="k", centre=17), ko, rtol=0, atol=1e-12)
    # without a centre a lone tensor centres on its own positions: 40..44 -> 42
    want = R.xpos(k.numpy(), 40 + np.arange(5), "k", 42, layout=layout)
    np.testing.assert_allclose(xpos.rotate(k, offset=40, kind="k").numpy(), want, atol=1e-12)


def test_zeta_is_torchscales_schedule():
    d = 64
    torchscale = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    torch.testing.assert_close(XPos(d).zeta, torchscale, rtol=1e-15, atol=0)
    np.testing.assert_allclose(R.xpos_zeta(d, 0.4), torchscale.numpy(), rtol=1e-15)
    assert XPos(d, rotary_dim=16, gamma=2.0).zeta.shape == (8,)


def _torchscale_procedure(x: torch.Tensor, downscale: bool, scale_base: float = 512.0) -> torch.Tensor:
    """torchscale's XPOS forward (offset 0) re-derived in plain float64 torch: RoPE on interleaved pairs at
    positions 0..L-1, both members of pair i times zeta_i^(p/B) for p = -(L//2 rounded up) .. , inverted for
    keys."""
    length, d = x.shape[-2], x.shape[-1]
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    low = -(length // 2 + length % 2)
    scale = zeta ** (torch.arange(low, low + length, dtype=torch.float64) / scale_base)[:, None]
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    theta = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq
    if downscale:
        scale = 1 / scale
    cos = (torch.cos(theta) * scale).repeat_interleave(2, -1)
    sin = (torch.sin(theta) * scale).repeat_interleave(2, -1)
    swapped = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    return x * cos + swapped * sin


@pytest.mark.parametrize("length", [6, 7, 40])
def test_matches_torchscale_procedure_with_its_centre(length):
    q, k = _randn(1, 2, length, 16), _randn(1, 2, length, 16, seed=1)
    xpos = XPos(16, scale_base=512)
    qo, ko = xpos(q, k, centre=math.ceil(length / 2))
    torch.testing.assert_close(qo, _torchscale_procedure(q, downscale=False), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ko, _torchscale_procedure(k, downscale=True), rtol=1e-12, atol=1e-12)


def _scores(xpos, q, k, positions, centre):
    qo, ko = xpos(q, k, positions=positions, centre=centre)
    return qo @ ko.transpose(-1, -2)


@given(
    st.integers(0, 5000),
    st.sampled_from(["interleaved", "half"]),
    st.sampled_from([None, 100.0, 2500.0]),
    st.booleans(),
)
def test_scores_depend_only_on_distance(shift, layout, centre, fractional):
    """Shifting every position leaves q.k unchanged, with a fixed centre or the default one."""
    xpos = XPos(16, layout=layout, rotary_dim=12)
    q, k = _randn(1, 2, 6, 16, seed=shift), _randn(1, 2, 6, 16, seed=shift + 1)
    p = torch.tensor([0.0, 3.0, 4.5, 9.0, 20.0, 31.0]) if fractional else torch.arange(6) * 7
    base = _scores(xpos, q, k, p, centre)
    shifted = _scores(xpos, q, k, p + shift, centre)
    torch.testing.assert_close(shifted, base, rtol=1e-9, atol=1e-9)


def test_score_decays_with_distance_on_average():
    """Mean |q.k| over random pairs shrinks with distance for gamma > 0; RoPE's (gamma -> inf) does not."""
    q, k = _randn(400, 1, 1, 32), _randn(400, 1, 1, 32, seed=1)
    distances = [0, 256, 1024, 4096]

    def mean_abs_score(xpos, d):
        qo = xpos.rotate(q, offset=d, kind="q", centre=0)
        ko = xpos.rotate(k, offset=0, kind="k", centre=0)
        return (qo * ko).sum(-1).abs().mean().item()

    decayed = [mean_abs_score(XPos(32, gamma=0.4), d) for d in distances]
    assert all(a > b for a, b in zip(decayed, decayed[1:], strict=False)), decayed
    assert decayed[-1] < 0.5 * decayed[0]
    rope_like = [mean_abs_score(XPos(32, gamma=1e9), d) for d in distances]
    assert max(rope_like) < 1.3 * min(rope_like), rope_like


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(head_dim=7), "head_dim must be even"),
        (dict(head_dim=8, scale_base=0), "scale_base must be a finite number > 0, got 0"),
        (dict(head_dim=8, scale_base=-512), "scale_base must be a finite number > 0"),
        (dict(head_dim=8, scale_base=math.inf), "scale_base must be a finite number > 0"),
        (dict(head_dim=8, gamma=-0.1), "gamma must be a finite number > 0, got -0.1"),
        (dict(head_dim=8, gamma=0.0), "gamma must be a finite number > 0"),
        (dict(head_dim=8, centre=math.nan), "centre must be a finite number"),
        (dict(head_dim=8, layout="neox"), "layout must be one of"),
    ],
)
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        XPos(**kwargs)


def test_bad_calls():
    xpos = XPos(8)
    x = _randn(2, 1, 4, 8)
    with pytest.raises(ValueError, match="kind must be one of 'q', 'k'; got None"):
        xpos.rotate(x, kind=None)  # rotate(x) alone rotates queries (kind="q" by default)
    with pytest.raises(ValueError, match="kind must be one of 'q', 'k'; got 'v'"):
        xpos.rotate(x, kind="v")
    with pytest.raises(ValueError, match=r"centre must be a number or a \(batch,\) tensor"):
        xpos(x, x, centre=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="centre must be finite"):
        xpos(x, x, centre=torch.tensor([0.0, math.inf]))
    with pytest.raises(ValueError, match="centre must be a finite number"):
        xpos(x, x, centre="middle")
    with pytest.raises(ValueError, match="positions give q's 2 positions; k has 4"):
        xpos(x[..., :2, :], x, positions=torch.arange(2))
    with pytest.raises(ValueError, match="last dimension head_dim=8"):
        xpos(x[..., :6], x)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(q_len=2, k_len=4, window=0), "window must be an integer >= 1, got 0"),
        (dict(q_len=2, k_len=4, window=2.5), "window must be an integer >= 1"),
        (dict(q_len=5, k_len=4, window=2), "q_len must be <= k_len"),
        (dict(q_len=-1, k_len=4, window=2), "q_len must be an integer >= 0"),
        (dict(q_len=1, k_len=4, window=2, offset=-3), "offset must be an integer >= 0"),
    ],
)
def test_bad_mask_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        blockwise_causal_mask(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_overflow_limits_are_the_documented_ones(dtype):
    """Keys p positions from the centre are scaled by zeta_0^(-p/B); the largest p a dtype holds is
    B ln(max) / ln(1/zeta_0): ~4.5k for float16 and ~36k for float32 (the module docstring's numbers)."""
    xpos = XPos(8, centre=0)
    limit = 512 * math.log(torch.finfo(dtype).max) / math.log(1.4 / 0.4)
    assert round(limit, -2) == {torch.float16: 4500, torch.float32: 36300}[dtype]
    x = torch.zeros(1, 1, 1, 8, dtype=dtype)
    x[..., 0::2] = 1  # unit pairs: each output is at most its pair's factor
    inside = xpos.rotate(x, offset=math.floor(limit) - 2, kind="k")
    assert torch.isfinite(inside).all()
    with pytest.raises(ValueError, match=f"past {dtype}'s largest"):
        xpos.rotate(x, offset=math.ceil(limit) + 2, kind="k")
    with pytest.raises(ValueError, match="too far from the centre"):  # queries underflow alike
        xpos.rotate(x, offset=math.ceil(limit) + 2, kind="q")


def test_float16_at_4000_positions_with_the_default_centre():
    q, k = _randn(1, 2, 4000, 32, dtype=torch.float16), _randn(1, 2, 4000, 32, seed=1, dtype=torch.float16)
    v = _randn(1, 2, 4000, 32, seed=2, dtype=torch.float16)
    xpos = XPos(32, layout="half")
    qo, ko = xpos(q, k)
    assert torch.isfinite(qo).all() and torch.isfinite(ko).all()
    for got, x, kind in ((qo, q, "q"), (ko, k, "k")):
        want = R.xpos(x.double().numpy(), np.arange(4000), kind, 2000, layout="half")
        np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-3, atol=2e-3)
    # uncentred (centre 0) the last keys would be scaled by (2/7)^(-3999/512) ~ 1.8e4: float16 holds |k| < 3.7
    out = posenc.attention(q, k, v, rotary=xpos)
    assert torch.isfinite(out).all()


def _plain_xpos(x, positions, centre, kind, scale_base=512.0, gamma=0.4):
    """xPos materialised in plain differentiable torch on interleaved pairs as complex numbers."""
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    zeta = (2 * i / d + gamma) / (1 + gamma)
    omega = 10000.0 ** (-2 * i / d)
    p = positions.to(torch.float64)[:, None]
    sign = 1.0 if kind == "q" else -1.0
    factor = torch.polar(zeta ** (sign * (p - centre) / scale_base), p * omega)
    pairs = torch.view_as_complex(x.unflatten(-1, (d // 2, 2)).contiguous())
    return torch.view_as_real(pairs * factor).flatten(-2)


def test_attention_gradients_match_a_plain_torch_formula():
    q = _randn(2, 2, 5, 8).requires_grad_()
    k = _randn(2, 2, 7, 8, seed=1).requires_grad_()
    v = _randn(2, 2, 7, 8, seed=2).requires_grad_()
    w = _randn(2, 2, 5, 8, seed=3)
    out = posenc.attention(q, k, v, rotary=XPos(8, scale_base=8))
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    qp = _plain_xpos(q, torch.arange(2, 7), 3.0, "q", scale_base=8)
    kp = _plain_xpos(k, torch.arange(7), 3.0, "k", scale_base=8)
    scores = qp @ kp.transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(torch.arange(7)[None, :] > torch.arange(2, 7)[:, None], -math.inf)
    want_out = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    want = torch.autograd.grad((want_out * w).sum(), (q, k, v))
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_gradcheck(layout):
    xpos = XPos(6, rotary_dim=4, layout=layout, scale_base=4)
    q = _randn(1, 2, 3, 6).requires_grad_()
    k = _randn(1, 2, 5, 6, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: xpos(a, b, offset=2), (q, k))
    assert torch.autograd.gradgradcheck(lambda a, b: xpos(a, b, offset=2), (q, k))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_decoding_with_cached_scaled_keys_equals_the_full_forward(layout):
    """With a fixed centre, keys scaled once and cached give the full forward pass's attention; with the
    default centre, one call holding the last queries and all keys (bottom-right) does too."""
    length = 9
    q, k, v = _randn(1, 4, length, 8), _randn(1, 2, length, 8, seed=1), _randn(1, 2, length, 8, seed=2)
    fixed = XPos(8, layout=layout, scale_base=16, centre=4)
    full = posenc.attention(q, k, v, rotary=fixed)
    keys = []
    for t in range(length):
        keys.append(fixed.rotate(k[..., t : t + 1, :], offset=t, kind="k"))
        q_t = fixed.rotate(q[..., t : t + 1, :], offset=t, kind="q")
        out_t = posenc.attention(q_t, torch.cat(keys, -2), v[..., : t + 1, :])
        torch.testing.assert_close(out_t, full[..., t : t + 1, :], rtol=1e-12, atol=1e-12)
    default = XPos(8, layout=layout, scale_base=16)
    torch.testing.assert_close(posenc.attention(q, k, v, rotary=default), full, rtol=1e-12, atol=1e-12)
    last = posenc.attention(q[..., -3:, :], k, v, rotary=default)
    torch.testing.assert_close(last, full[..., -3:, :], rtol=1e-12, atol=1e-12)


def test_inplace_equals_out_of_place():
    xpos = XPos(8, rotary_dim=6)
    q, k = _randn(1, 2, 5, 8, dtype=torch.float32), _randn(1, 2, 5, 8, seed=1, dtype=torch.float32)
    want = xpos(q, k, offset=3)
    with torch.no_grad():
        got = xpos(q.clone(), k.clone(), offset=3, inplace=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


@given(st.integers(0, 12), st.integers(0, 12), st.integers(1, 6), st.integers(0, 20))
def test_blockwise_causal_mask_matches_reference(q_len, extra, window, offset):
    k_len = q_len + extra
    got = blockwise_causal_mask(q_len, k_len, window, offset=offset)
    assert got.dtype == torch.bool and got.shape == (q_len, k_len)
    np.testing.assert_array_equal(got.numpy(), R.blockwise_causal_mask(q_len, k_len, window, offset))


def test_blockwise_causal_mask_sees_own_and_previous_block():
    mask = blockwise_causal_mask(8, 8, 3)
    assert mask[7].tolist() == [False, False, False, True, True, True, True, True]  # blocks 1 and 2
    assert mask[2].tolist() == [True, True, True] + [False] * 5  # block 0 has no previous block
    assert mask.sum(-1).tolist() == [1, 2, 3, 4, 5, 6, 4, 5]


@pytest.mark.parametrize("q_len", [12, 5])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_attention_with_xpos_and_blockwise_mask_matches_reference(q_len, layout):
    k_len, window = 12, 4
    q, k, v = _randn(2, 2, q_len, 8), _randn(2, 2, k_len, 8, seed=1), _randn(2, 2, k_len, 8, seed=2)
    xpos = XPos(8, layout=layout, scale_base=16)
    mask = blockwise_causal_mask(q_len, k_len, window)
    got = posenc.attention(q, k, v, rotary=xpos, bias=mask)
    centre = k_len // 2
    qr = R.xpos(q, np.arange(k_len - q_len, k_len), "q", centre, scale_base=16, layout=layout)
    kr = R.xpos(k, np.arange(k_len), "k", centre, scale_base=16, layout=layout)
    bias = np.where(R.blockwise_causal_mask(q_len, k_len, window), 0.0, -np.inf)
    want = R.attention(qr, kr, v, bias=bias, causal=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_compiles_fullgraph_and_equals_eager(fresh_dynamo):
    """fullgraph=True raises at the first graph break; values and gradients equal eager's."""
    xpos = XPos(16, layout="half", rotary_dim=12)

    def step(q, k, v):
        return posenc.attention(q, k, v, rotary=xpos, bias=blockwise_causal_mask(q.shape[-2], k.shape[-2], 4))

    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")
    q = _randn(2, 4, 6, 16, dtype=torch.float32).requires_grad_()
    k = _randn(2, 2, 9, 16, seed=1, dtype=torch.float32).requires_grad_()
    v = _randn(2, 2, 9, 16, seed=2, dtype=torch.float32)
    got = compiled(q, k, v)
    got_grads = torch.autograd.grad(got.square().sum(), (q, k))
    want = step(q, k, v)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize(
    "mode, centre", [("unrotated", None), ("unrotated", 5.0), ("rerotate", 5.0), ("hf", 5.0)]
)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotary_kv_cache_decodes_xpos_as_the_full_forward(mode, centre, layout):
    """Token by token through RotaryKVCache equals the full forward's attention at every length: the
    queries are scaled as queries, the keys as keys, about one centre (the fixed one, or in "unrotated"
    mode the middle of the keys, as a full forward pass over them)."""
    length = 11
    q, k, v = _randn(1, 4, length, 8), _randn(1, 2, length, 8, seed=1), _randn(1, 2, length, 8, seed=2)
    xpos = XPos(8, layout=layout, scale_base=8, centre=centre)
    cache = posenc.RotaryKVCache(xpos, mode)
    prefill = 4
    q_rot, keys, values = cache.update(q[..., :prefill, :], k[..., :prefill, :], v[..., :prefill, :])
    first = posenc.attention(q_rot, keys, values)
    full = posenc.attention(q[..., :prefill, :], k[..., :prefill, :], v[..., :prefill, :], rotary=xpos)
    torch.testing.assert_close(first, full, rtol=1e-12, atol=1e-12)
    for t in range(prefill, length):
        q_rot, keys, values = cache.update(q[..., t : t + 1, :], k[..., t : t + 1, :], v[..., t : t + 1, :])
        full = posenc.attention(q[..., : t + 1, :], k[..., : t + 1, :], v[..., : t + 1, :], rotary=xpos)
        torch.testing.assert_close(
            posenc.attention(q_rot, keys, values), full[..., -1:, :], rtol=1e-12, atol=1e-12
        )
        expected = R.xpos(
            k[..., : t + 1, :].numpy(),
            np.arange(t + 1),
            "k",
            (t + 1) // 2 if centre is None else centre,
            scale_base=8,
            layout=layout,
        )
        np.testing.assert_allclose(keys.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_rotary_kv_cache_refuses_to_keep_xpos_keys_scaled_without_a_fixed_centre():
    for mode in ("rerotate", "hf"):
        with pytest.raises(ValueError, match=f"mode='{mode}' caches xPos keys already scaled.*centre=c"):
            posenc.RotaryKVCache(XPos(8), mode)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rerotate_keys_moves_xpos_keys_with_their_scale(layout):
    """Keys at p shifted by delta are the keys at p + delta (posenc.reference.xpos), scale included."""
    xpos = XPos(8, rotary_dim=6, layout=layout, scale_base=16)
    k = _randn(2, 3, 7, 8, seed=3)
    p = np.arange(7) + 10.0
    keys = torch.from_numpy(R.xpos(k.numpy(), p, "k", 12.0, scale_base=16, layout=layout, rotary_dim=6))
    for delta in (-4, 2.5, torch.tensor([[0.0, -1, 2, 3, -5, 6, 7]] * 2)):
        moved = posenc.rerotate_keys(keys, delta, xpos)
        shift = delta.numpy() if isinstance(delta, torch.Tensor) else delta
        expected = R.xpos(k.numpy(), p + shift, "k", 12.0, scale_base=16, layout=layout, rotary_dim=6)
        np.testing.assert_allclose(moved.numpy(), expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="the shift is too long for it; shift less or use a wider dtype"):
        posenc.rerotate_keys(keys.half(), 20_000, xpos)
