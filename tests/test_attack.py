"""A property-based attack on posenc's public constructors and on ``posenc.attention``: one argument at a
time is replaced by a value users pass by mistake (zero, negatives, NaN, infinities, huge sizes, strings,
None, booleans, lists, tensors). Each call either works, giving finite outputs of the right shape, or
raises ValueError / TypeError naming the argument: never another exception, never NaN, and never a cost
sized by the value (a huge size is refused before anything is allocated)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as R
from posenc.rope.axial import grid_positions

MISTAKES = [
    0,
    -1,
    -7,
    1.5,
    float("nan"),
    float("inf"),
    -float("inf"),
    2**40,
    2**63,
    2**64,
    10**30,
    1e300,
    "8",
    None,
    True,
    [8],
    torch.tensor(8),
    np.int64(-3),
    np.float32(0.5),
]

Q = torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(0))
ROPE = posenc.RotaryEmbedding(8, layout="half")


def _with_bias(bias):
    return posenc.attention(Q, Q, Q, bias=bias)


def _with_remap(remap):
    return posenc.attention(Q, Q, Q, rotary=ROPE, remap=remap)


def _rotate(rope):
    q, k = rope(Q, Q)
    return torch.cat((q, k))


ATTENTION = (1, 2, 6, 8)  # the output shape of attention over Q


def _with_rotary(rotary):
    return posenc.attention(Q, Q, Q, rotary=rotary)


def _with_grid(axial):
    return posenc.attention(Q, Q, Q, rotary=axial, positions=grid_positions(2, 3))


def _streamed(cache):
    """Two updates, the second past the window: the new queries attend to every kept key."""
    cache.update(Q[:, :, :4], Q[:, :, :4], Q[:, :, :4])
    return posenc.attention(*cache.update(Q[:, :, 4:], Q[:, :, 4:], Q[:, :, 4:]))


# name: (the callable, valid keyword arguments, what to run on what it returns, the output's shape)
SPECS = {
    "RotaryEmbedding": (
        posenc.RotaryEmbedding,
        dict(
            head_dim=8,
            base=10000.0,
            rotary_dim=None,
            layout="half",
            scaling=None,
            max_position_embeddings=None,
        ),
        _rotate,
        (2, 2, 6, 8),
    ),
    "XPos": (
        posenc.XPos,
        dict(
            head_dim=8, base=10000.0, rotary_dim=None, layout="half", scale_base=512.0, gamma=0.4, centre=None
        ),
        _rotate,
        (2, 2, 6, 8),
    ),
    "FoPE": (
        posenc.FoPE,
        dict(
            head_dim=8,
            heads=2,
            train_len=16,
            base=10000.0,
            fourier_dim=None,
            sigma=0.3,
            layout="half",
            learnable=False,
            generator=None,
        ),
        _with_rotary,
        ATTENTION,
    ),
    "AxialRotaryEmbedding": (
        posenc.AxialRotaryEmbedding,
        dict(head_dim=8, axes=2, base=100.0, mixed=False, num_heads=None, layout="interleaved", seed=0),
        _with_grid,
        ATTENTION,
    ),
    "AxialRotaryEmbedding-mixed": (
        posenc.AxialRotaryEmbedding,
        dict(head_dim=8, axes=2, base=100.0, mixed=True, num_heads=2, layout="interleaved", seed=0),
        _with_grid,
        ATTENTION,
    ),
    "StreamingKVCache": (
        posenc.StreamingKVCache,
        dict(rotary=ROPE, sink_tokens=1, window=4),
        _streamed,
        (1, 2, 2, 8),
    ),
    "RotaryKVCache": (
        posenc.RotaryKVCache,
        dict(rotary=ROPE, mode="unrotated"),
        _streamed,
        (1, 2, 2, 8),
    ),
    "rerotate_keys": (
        lambda **kw: kw,
        dict(delta=1, rotary=ROPE, context_len=None),
        lambda kw: posenc.rerotate_keys(Q, **kw),
        ATTENTION,
    ),
    "ALiBi": (posenc.ALiBi, dict(n_heads=2), _with_bias, ATTENTION),
    "T5Bias": (
        posenc.T5Bias,
        dict(n_heads=2, num_buckets=8, max_distance=16),
        _with_bias,
        ATTENTION,
    ),
    "KerpleBias": (posenc.KerpleBias, dict(n_heads=2, kind="log"), _with_bias, ATTENTION),
    "SandwichBias": (posenc.SandwichBias, dict(n_heads=2, dim=8), _with_bias, ATTENTION),
    "FireBias": (posenc.FireBias, dict(n_heads=2, hidden=4, train_len=16, c=0.1), _with_bias, ATTENTION),
    "ShawRelative": (posenc.ShawRelative, dict(head_dim=8, max_distance=4), _with_bias, ATTENTION),
    "CoPE": (posenc.CoPE, dict(head_dim=8, npos_max=8), _with_bias, ATTENTION),
    "SinusoidalEncoding": (
        posenc.SinusoidalEncoding,
        dict(d_model=8, base=10000.0),
        lambda e: e(Q[0]),
        (2, 6, 8),
    ),
    "LearnedEmbedding": (
        posenc.LearnedEmbedding,
        dict(max_len=16, d_model=8, init_std=0.02),
        lambda e: e(Q[0]),
        (2, 6, 8),
    ),
    "SelfExtend": (posenc.SelfExtend, dict(group_size=2, window=2), _with_remap, ATTENTION),
    "ReRoPE": (posenc.ReRoPE, dict(window=2, leaky=None, log_n_length=None), _with_remap, ATTENTION),
    "STRING": (posenc.STRING, dict(shift=3, local_window=2, attention_factor=1.0), _with_remap, ATTENTION),
    "DualChunk": (
        posenc.DualChunk,
        dict(chunk_size=4, local_size=2, original_max_position_embeddings=None),
        _with_remap,
        ATTENTION,
    ),
    "MRotaryEmbedding": (
        posenc.MRotaryEmbedding,
        dict(
            head_dim=8,
            mrope_section=(2, 1, 1),
            base=10000.0,
            interleaved=False,
            scaling=None,
            layout="half",
            rotary_dim=None,
            max_position_embeddings=None,
            order=None,
        ),
        lambda m: posenc.attention(Q, Q, Q, rotary=m, positions=torch.arange(6).expand(3, 1, -1)),
        ATTENTION,
    ),
    "remap_attention": (
        lambda **kw: kw,
        dict(
            remap=posenc.SelfExtend(2, 3),
            offset=0,
            scale=None,
            block=None,
            kernel="flash",
            sinks=None,
            window=None,
        ),
        lambda kw: posenc.remap.remap_attention(Q, Q, Q, ROPE, **kw),
        ATTENTION,
    ),
    "packed_positions": (
        lambda **kw: kw,
        dict(cu_seqlens=torch.tensor([0, 2, 6]), document_ids=None),
        lambda kw: torch.cat(ROPE(Q, Q, positions=posenc.packed_positions(**kw))),
        (2, 2, 6, 8),
    ),
    "attention": (
        lambda **kw: kw,
        dict(rotary=ROPE, causal=True, offset=0, scale=None, positions=None, remap=None, sinks=None),
        lambda kw: posenc.attention(Q, Q, Q, **kw),
        ATTENTION,
    ),
}

CASES = [(name, arg) for name, (_, valid, _, _) in SPECS.items() for arg in valid]


def _outputs(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if isinstance(t, torch.Tensor)]


def attack(name, make, valid, run, shape, argument, value) -> None:
    """One wrong argument: a ValueError/TypeError naming it, or finite outputs of the right shape."""
    try:
        out = run(make(**{**valid, argument: value}))
    except (ValueError, TypeError) as e:
        assert argument in str(e), f"{name}({argument}={value!r}) raised without naming {argument}: {e}"
        return
    for t in _outputs(out):
        assert tuple(t.shape) == shape, f"{name}({argument}={value!r}) changed the shape to {tuple(t.shape)}"
        assert torch.isfinite(t).all(), f"{name}({argument}={value!r}) gave non-finite output"


@pytest.mark.parametrize("name, argument", CASES, ids=[f"{n}-{a}" for n, a in CASES])
@settings(
    max_examples=len(MISTAKES), deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(value=st.sampled_from(MISTAKES))
def test_one_wrong_argument_is_refused_by_name_or_works(name, argument, value):
    attack(name, *SPECS[name], argument, value)


def _refuses_by_another_name(head_dim):
    raise ValueError(f"base must be > 0, got {head_dim!r}")


@pytest.mark.parametrize(
    "make, message",
    [(lambda head_dim: head_dim, "non-finite"), (_refuses_by_another_name, "without naming")],
    ids=["nan-let-through", "error-without-the-name"],
)
def test_the_attack_catches_what_it_is_for(make, message):
    """The property can fail: a NaN that reaches the output, or a refusal that names another argument."""
    with pytest.raises(AssertionError, match=message):
        attack("broken", make, dict(head_dim=8), lambda v: Q[0] * v, (2, 6, 8), "head_dim", float("nan"))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    q_shape=st.tuples(
        st.integers(1, 2), st.sampled_from([1, 2, 4]), st.integers(1, 5), st.sampled_from([4, 8])
    ),
    k_heads=st.sampled_from([1, 2, 3, 4]),
    k_len=st.integers(0, 6),
    k_dim=st.sampled_from([4, 8]),
    v_dim=st.sampled_from([4, 8, 6]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]),
    rotary=st.booleans(),
    bias=st.sampled_from([None, "alibi", "t5"]),
)
def test_attention_on_mismatched_tensors_is_refused_by_name_or_right(
    q_shape, k_heads, k_len, k_dim, v_dim, dtype, rotary, bias
):
    """q, k, v of every shape and dtype combination: a ValueError naming q, k, v or the mismatch, or an
    output of q's batch, heads and length with v's width, finite."""
    b, h, n, d = q_shape
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, n, d, generator=gen).to(dtype)
    k = torch.randn(b, k_heads, k_len, k_dim, generator=gen).to(dtype)
    v = torch.randn(b, k_heads, k_len, v_dim, generator=gen).to(dtype)
    extra = {"rotary": posenc.RotaryEmbedding(d, layout="half")} if rotary else {}
    if bias == "alibi":
        extra["bias"] = posenc.ALiBi(h)
    elif bias == "t5":
        extra["bias"] = posenc.T5Bias(h, num_buckets=8, max_distance=16)
    try:
        out = posenc.attention(q, k, v, **extra)
    except (ValueError, TypeError) as e:
        assert any(w in str(e) for w in ("q", "k", "v", "head")), f"unnamed: {e}"
        return
    assert out.shape == (b, h, n, v_dim) and torch.isfinite(out.float()).all()


Q3 = Q.expand(1, 2, 6, 8)
BAD_POSITIONS = {
    "nan": torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0, 5.0]),
    "inf": torch.tensor([0.0, 1.0, float("inf"), 3.0, 4.0, 5.0]),
    "-inf": torch.tensor([0.0, 1.0, -float("inf"), 3.0, 4.0, 5.0]),
    "past-2^53": torch.tensor([0, 1, 2, 3, 4, 2**62]),
    "bool": torch.ones(6, dtype=torch.bool),
    "uint8": torch.arange(6, dtype=torch.uint8),
    "uint32": torch.arange(6).to(torch.uint32),
    "complex": torch.arange(6).to(torch.complex64),
    "short": torch.arange(5),
    "3-d": torch.zeros(1, 1, 6, dtype=torch.long),
    "list": [0, 1, 2, 3, 4, 5],
}


def _text_positions(bad):
    """Bad 1-D positions as each rotary takes them: M-RoPE's text form, axial's (N, 2) coordinates."""
    return bad


def _grid(bad):
    if not isinstance(bad, torch.Tensor) or bad.dim() != 1 or bad.shape[0] != 6:
        return bad
    return torch.stack((bad, bad), -1)


# name: (the rotary, how a bad (6,) positions tensor becomes its positions)
ROTARIES = {
    "RotaryEmbedding": (ROPE, _text_positions),
    "XPos": (posenc.XPos(8, layout="half"), _text_positions),
    "MRotaryEmbedding": (posenc.MRotaryEmbedding(8, (2, 1, 1)), _text_positions),
    "AxialRotaryEmbedding": (posenc.AxialRotaryEmbedding(8), _grid),
    "AxialRotaryEmbedding-mixed": (posenc.AxialRotaryEmbedding(8, mixed=True, num_heads=2), _grid),
    "FoPE": (posenc.FoPE(8, heads=2, train_len=16, layout="half"), _text_positions),
}
POSITION_CASES = [(r, k, b) for r in ROTARIES for k in ("positions", "k_positions") for b in BAD_POSITIONS]


@pytest.mark.parametrize("rotary, argument, bad", POSITION_CASES, ids=["-".join(c) for c in POSITION_CASES])
def test_bad_positions_are_refused_by_name_by_every_rotary(rotary, argument, bad):
    """Non-finite, too far, of a wrong dtype or shape: every rotary, called directly and through
    ``posenc.attention(positions=)``, refuses them with a ValueError naming the argument, never NaN."""
    module, form = ROTARIES[rotary]
    wrong = form(BAD_POSITIONS[bad])
    good = form(torch.arange(6))
    if rotary == "MRotaryEmbedding" and argument == "k_positions":
        good = torch.arange(6).expand(3, 1, 6)
    given = {"positions": wrong} if argument == "positions" else {"positions": good, "k_positions": wrong}
    for call in (
        lambda: module(Q3, Q3, **given),
        lambda: posenc.attention(Q3, Q3, Q3, rotary=module, **given),
    ):
        try:
            out = call()
        except (ValueError, TypeError) as e:
            assert argument.removeprefix("k_") in str(e), f"{rotary}({argument}={bad}) unnamed: {e}"
            continue
        raise AssertionError(f"{rotary} took {argument}={bad}, giving {out}")


# ---------------------------------------------------------------- accepted, and then right: RoPE's subclasses
# XPos is a RotaryEmbedding whose keys differ from its queries (keys scaled by zeta^(-m/B), queries by
# zeta^(+n/B)): everything that takes a RotaryEmbedding must scale keys as keys, or refuse it.

XPOS = posenc.XPos(8, layout="half", scale_base=16.0)  # a strong decay, so that a key scaled as a query shows
XQ, XK, XV = (
    torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
    for s in (3, 4, 5)
)


def _xpos(x, positions, kind, centre):
    return R.xpos(x.numpy(), np.asarray(positions), kind, centre, scale_base=16.0, layout="half")


def _xpos_attention(q, k, v, q_pos, k_pos, centre=0.0):
    """xPos attention in numpy: queries scaled as queries, keys as keys, about one centre."""
    qr, kr = _xpos(q, q_pos, "q", centre), _xpos(k, k_pos, "k", centre)
    return R.attention(qr, kr, v.numpy(), causal=True)


def _xpos_remapped(q, k, v, distance, query_scale=None, sinks=None):
    """Pair (i, j) at its remapped distance f: the query rotated and scaled as an xPos query at f, the key
    at 0 (xPos's score depends on n - m alone)."""
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    if query_scale is not None:
        qn = qn * np.asarray(query_scale)[:, None]
    lq, lk = distance.shape
    scores = np.full((*qn.shape[:-2], lq, lk), -np.inf)
    for i in range(lq):
        seen = ~np.isnan(distance[i])
        qi = np.broadcast_to(qn[..., i : i + 1, :], (*qn.shape[:-2], lk, qn.shape[-1]))
        rotated = R.xpos(qi, np.where(seen, distance[i], 0.0), "q", 0.0, scale_base=16.0, layout="half")
        scores[..., i, :] = np.where(seen, (rotated * kn).sum(-1) / math.sqrt(qn.shape[-1]), -np.inf)
    if sinks is not None:
        column = np.broadcast_to(np.asarray(sinks)[:, None, None], (*scores.shape[:-1], 1))
        return R.softmax(np.concatenate([scores, column], -1))[..., :-1] @ vn
    return R.softmax(scores) @ vn


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


def test_xpos_keys_are_scaled_as_keys_by_every_cache():
    """StreamingKVCache, before and after evicting, and RotaryKVCache in every mode it takes: attention over
    what they return equals xPos attention over the same tokens at their (cache) positions."""
    n = XQ.shape[-2]
    want = _xpos_attention(XQ[:, :, 4:], XK, XV, np.arange(4, n), np.arange(n), centre=n // 2)
    _close(posenc.attention(XQ[:, :, 4:], XK, XV, rotary=XPOS), want)
    stream = posenc.StreamingKVCache(XPOS, sink_tokens=1, window=6)
    stream.update(XQ[:, :, :4], XK[:, :, :4], XV[:, :, :4])
    _close(posenc.attention(*stream.update(XQ[:, :, 4:], XK[:, :, 4:], XV[:, :, 4:])), want)
    kept = [0, 2, 3, 4, 5, 6]  # one more token: the sink and the last five, at cache positions 0..5
    last = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    got = posenc.attention(*stream.update(last, XK[:, :, 6:], XV[:, :, 6:]))
    k_kept, v_kept = XK[:, :, kept + [6]][:, :, 1:], XV[:, :, kept + [6]][:, :, 1:]
    k_kept, v_kept = torch.cat((XK[:, :, :1], k_kept), 2), torch.cat((XV[:, :, :1], v_kept), 2)
    _close(got, _xpos_attention(last, k_kept, v_kept, [6], np.arange(7), centre=3))
    for mode, rotary in (
        ("unrotated", XPOS),
        ("rerotate", posenc.XPos(8, layout="half", scale_base=16.0, centre=3)),
    ):
        cache = posenc.RotaryKVCache(rotary, mode=mode)
        cache.update(XQ[:, :, :4], XK[:, :, :4], XV[:, :, :4])
        _close(posenc.attention(*cache.update(XQ[:, :, 4:], XK[:, :, 4:], XV[:, :, 4:])), want)
    with pytest.raises(ValueError, match="centre"):
        posenc.RotaryKVCache(XPOS, mode="rerotate")


def test_rerotate_keys_moves_xpos_keys_as_keys():
    rotated = XPOS.rotate(XK, kind="k", centre=2.0)
    _close(posenc.rerotate_keys(rotated, 3, XPOS), _xpos(XK, np.arange(3, 10), "k", 2.0))


REMAPS = {
    "SelfExtend(2, 3)": (posenc.SelfExtend(2, 3), lambda lq, lk: R.selfextend_distance(lq, lk, 2, 3), None),
    "ReRoPE(3)": (posenc.ReRoPE(3), lambda lq, lk: R.rerope_distance(lq, lk, 3), None),
    "ReRoPE(3, leaky=2)": (
        posenc.ReRoPE(3, leaky=2.0),
        lambda lq, lk: R.rerope_distance(lq, lk, 3, 2.0),
        None,
    ),
    "STRING(4, 2, 1.2)": (
        posenc.STRING(4, 2, attention_factor=1.2),
        lambda lq, lk: R.string_distance(lq, lk, 4, 2),
        1.2**2,
    ),
    "DualChunk(4, 1)": (posenc.DualChunk(4, 1), lambda lq, lk: R.dual_chunk_distance(lq, lk, 4, 1), None),
}


@pytest.mark.parametrize("kernel", ["flash", "blocks", "flex"])
@pytest.mark.parametrize("remap", REMAPS)
def test_remaps_and_sinks_scale_xpos_keys_as_keys(remap, kernel):
    """Every remap with xPos, on every kernel, with and without sinks: queries scaled as queries and keys as
    keys in each view, so each pair decays by its remapped distance; a remap that keeps every distance is
    plain xPos attention."""
    module, distance, factor = REMAPS[remap]
    lq, lk = 3, XK.shape[-2]
    dist = distance(lq, lk)
    scale = None if factor is None else np.full(lq, factor)
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    for s in (None, sinks):
        got = posenc.remap.remap_attention(XQ[:, :, 4:], XK, XV, XPOS, module, kernel=kernel, sinks=s)
        _close(got, _xpos_remapped(XQ[:, :, 4:], XK, XV, dist, scale, None if s is None else s.numpy()))
    plain = _xpos_attention(XQ[:, :, 4:], XK, XV, np.arange(4, lk), np.arange(lk))
    _close(posenc.attention(XQ[:, :, 4:], XK, XV, rotary=XPOS, remap=posenc.SelfExtend(1, 3)), plain)
    got = posenc.attention(
        XQ[:, :, 4:], XK, XV, rotary=XPOS, sinks=torch.full((2,), -1e4, dtype=torch.float64)
    )
    _close(got, plain)
