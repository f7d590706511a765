"""A property-based attack on posenc's public constructors and on ``posenc.attention``: one argument at a
time is replaced by a value users pass by mistake (zero, negatives, NaN, infinities, huge sizes, strings,
None, booleans, lists, tensors). Each call either works, giving finite outputs of the right shape, or
raises ValueError / TypeError naming the argument: never another exception, never NaN, and never a cost
sized by the value (a huge size is refused before anything is allocated)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc

MISTAKES = [
    0,
    -1,
    -7,
    1.5,
    float("nan"),
    float("inf"),
    -float("inf"),
    2**40,
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

# name: (the callable, valid keyword arguments, what to run on what it returns, the output's shape)
SPECS = {
    "RotaryEmbedding": (
        posenc.RotaryEmbedding,
        dict(head_dim=8, base=10000.0, rotary_dim=None, layout="half", max_position_embeddings=None),
        _rotate,
        (2, 2, 6, 8),
    ),
    "XPos": (
        posenc.XPos,
        dict(head_dim=8, base=10000.0, rotary_dim=None, layout="half", scale_base=512.0, gamma=0.4),
        _rotate,
        (2, 2, 6, 8),
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
        dict(head_dim=8, mrope_section=(2, 1, 1), base=10000.0, interleaved=False, layout="half"),
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
        dict(rotary=ROPE, causal=True, offset=0, scale=None),
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
