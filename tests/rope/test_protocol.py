"""The rotary protocol: RoPE, xPos, M-RoPE, axial RoPE and FoPE offer forward / rotate / cos_sin alike, and
posenc.attention(rotary=...) takes any of them (or anything else implementing it) through one path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import (
    ALiBi,
    AxialRotaryEmbedding,
    FoPE,
    MRotaryEmbedding,
    RotaryEmbedding,
    RotaryProtocol,
    XPos,
)
from posenc import reference as R
from posenc.rope.axial import grid_positions


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _modules():
    return [
        RotaryEmbedding(8),
        XPos(8),
        MRotaryEmbedding(8, (2, 1, 1)),
        AxialRotaryEmbedding(8),
        AxialRotaryEmbedding(8, mixed=True, num_heads=2),
        FoPE(8, 2, train_len=64),
    ]


@pytest.mark.parametrize("module", _modules(), ids=lambda m: type(m).__name__)
def test_every_rotary_embedding_implements_the_protocol(module):
    assert isinstance(module, RotaryProtocol)
    assert posenc.rope.protocol.is_rotary(module) and posenc.rope.protocol.is_rotary(module)  # remembered


@pytest.mark.parametrize("other", [ALiBi(2), "rope", None, torch.nn.Linear(2, 2)], ids=repr)
def test_other_objects_do_not(other):
    assert not isinstance(other, RotaryProtocol)
    assert not posenc.rope.protocol.is_rotary(other)


def test_xpos_rotate_without_a_kind_rotates_queries_as_forward_does():
    xpos = XPos(8)
    x, k = _randn(2, 3, 10, 8), _randn(2, 3, 10, 8, seed=1)
    got = xpos.rotate(x)
    assert torch.equal(got, xpos(x, k)[0])
    assert torch.equal(got, xpos.rotate(x, kind="q"))
    want = R.xpos(x.numpy(), np.arange(10), "q", centre=5)  # the middle of positions 0..9, rounded up
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


@given(st.integers(1, 12), st.integers(0, 30))
@settings(max_examples=25, deadline=None)
def test_xpos_rotate_defaults_to_the_query_scaling_at_any_length_and_offset(seq, offset):
    xpos = XPos(8)
    x = _randn(1, 2, seq, 8, seed=seq)
    centre = offset + seq // 2
    want = R.xpos(x.numpy(), np.arange(offset, offset + seq), "q", centre=centre)
    np.testing.assert_allclose(xpos.rotate(x, offset=offset).numpy(), want, rtol=0, atol=1e-12)


def test_cos_sin_of_positions_alone():
    rope = RotaryEmbedding(8)
    pos = torch.tensor([[3, 1, 4], [1, 5, 9]])
    for got, want in zip(rope.cos_sin(pos), rope.cos_sin(3, pos), strict=True):
        assert torch.equal(got, want)
    for got, want in zip(rope.cos_sin(positions=pos[0]), rope.cos_sin(3, pos[0]), strict=True):
        assert torch.equal(got, want)
    theta = pos.double()[..., None] * torch.from_numpy(R.inverse_frequencies(8))
    torch.testing.assert_close(rope.cos_sin(pos)[0].double(), torch.cos(theta), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="positions given twice"):
        rope.cos_sin(pos, pos)
    with pytest.raises(ValueError, match="cos_sin needs positions"):
        rope.cos_sin()
    mrope = MRotaryEmbedding(8, (2, 1, 1))
    axial = AxialRotaryEmbedding(8)
    assert mrope.cos_sin(positions=torch.arange(5))[0].shape == (5, 4)
    assert axial.cos_sin(positions=grid_positions(2, 3))[0].shape == (1, 6, 4)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=False)


@pytest.mark.parametrize("mixed", [False, True])
def test_attention_with_axial_rope_is_rotation_then_sdpa(mixed):
    axial = AxialRotaryEmbedding(16, mixed=mixed, num_heads=3 if mixed else None)
    pos = grid_positions(3, 4)
    q, k, v = (_randn(2, 3, 12, 16, seed=s, dtype=torch.float32) for s in range(3))
    with torch.no_grad():
        got = posenc.attention(q, k, v, rotary=axial, positions=pos, causal=False)
        qr, kr = axial(q, k, positions=pos)
        assert torch.equal(got, _sdpa(qr, kr, v))
        assert torch.equal(axial.rotate(q, positions=pos), qr) and torch.equal(
            axial.rotate(k, grid=(3, 4)), kr
        )
    freqs = axial.freqs.detach().double().numpy() if mixed else R.axial_frequencies(16, 2, 100.0)
    rq = R.axial_rope(q.numpy(), pos.numpy(), freqs)
    rk = R.axial_rope(k.numpy(), pos.numpy(), freqs)
    np.testing.assert_allclose(got.numpy(), R.attention(rq, rk, v.numpy()), atol=1e-5)


def test_axial_keys_at_their_own_positions():
    """Cross-attention from a 2x2 grid to a 3x4 one: keys take k_positions, after their own prefix."""
    axial = AxialRotaryEmbedding(16)
    q, k, v = _randn(1, 2, 1 + 4, 16), _randn(1, 2, 1 + 12, 16, seed=1), _randn(1, 2, 1 + 12, 8, seed=2)
    qp, kp = grid_positions(2, 2) * 1.5, grid_positions(3, 4)
    qr, kr = axial(q, k, positions=qp, k_positions=kp, prefix_tokens=1)
    freqs = R.axial_frequencies(16, 2, 100.0)
    np.testing.assert_allclose(
        qr.numpy(), R.axial_rope(q.numpy(), qp.numpy(), freqs, prefix_tokens=1), atol=1e-12
    )
    np.testing.assert_allclose(
        kr.numpy(), R.axial_rope(k.numpy(), kp.numpy(), freqs, prefix_tokens=1), atol=1e-12
    )
    got = posenc.attention(
        q[..., 1:, :], k[..., 1:, :], v[..., 1:, :], rotary=axial, positions=qp, k_positions=kp, causal=False
    )
    rq = R.axial_rope(q[..., 1:, :].numpy(), qp.numpy(), freqs)
    rk = R.axial_rope(k[..., 1:, :].numpy(), kp.numpy(), freqs)
    want = R.attention(rq, rk, v[..., 1:, :].numpy())
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    with pytest.raises(ValueError, match="k_positions must be a tensor"):
        axial(q, k, positions=qp, k_positions=[[0, 0]], prefix_tokens=1)
    with pytest.raises(ValueError, match=r"k must have shape \(\.\.\., prefix_tokens \+ N = 5"):
        axial(q, k, positions=qp, prefix_tokens=1)


@pytest.mark.parametrize(
    "module, positions",
    [
        (MRotaryEmbedding(8, (2, 1, 1)), torch.arange(6)),
        (AxialRotaryEmbedding(8), grid_positions(2, 3)),
    ],
    ids=lambda m: type(m).__name__ if isinstance(m, torch.nn.Module) else "",
)
def test_an_offset_is_refused_where_positions_are_not_a_run(module, positions):
    q = _randn(1, 2, 6, 8)
    name = type(module).__name__
    with pytest.raises(ValueError, match=rf"offset=3 is not used with {name}"):
        module(q, q, positions=positions, offset=3)
    with pytest.raises(ValueError, match=rf"offset=3 is not used with {name}"):
        posenc.attention(q, q, q, rotary=module, positions=positions, offset=3)


def test_xpos_through_attention_is_rotation_then_attention():
    xpos = XPos(8)
    q, k, v = _randn(1, 2, 3, 8), _randn(1, 2, 7, 8, seed=1), _randn(1, 2, 7, 8, seed=2)
    got = posenc.attention(q, k, v, rotary=xpos, offset=2)
    qr, kr = xpos(q, k, offset=2)
    rq = R.xpos(q.numpy(), np.arange(6, 9), "q", centre=2 + 7 // 2)
    rk = R.xpos(k.numpy(), np.arange(2, 9), "k", centre=2 + 7 // 2)
    np.testing.assert_allclose(qr.numpy(), rq, atol=1e-12)
    np.testing.assert_allclose(got.numpy(), R.attention(rq, rk, v.numpy(), causal=True), atol=1e-12)


class _Halving:
    """A rotary of one's own (no nn.Module): every query and key scaled by 1/2, so scores by 1/4."""

    def __call__(self, q, k, *, positions=None, k_positions=None, offset=0):
        return self.forward(q, k, positions=positions, k_positions=k_positions, offset=offset)

    def forward(self, q, k, *, positions=None, k_positions=None, offset=0):
        return self.rotate(q), self.rotate(k)

    def rotate(self, x, positions=None):
        return x / 2

    def cos_sin(self, positions):
        n = positions.shape[-1]
        return torch.full((n, 4), 0.5), torch.zeros(n, 4)


def test_any_object_implementing_the_protocol_is_a_rotary():
    q, k, v = _randn(1, 2, 5, 8), _randn(1, 2, 5, 8, seed=1), _randn(1, 2, 5, 8, seed=2)
    assert isinstance(_Halving(), RotaryProtocol)
    got = posenc.attention(q, k, v, rotary=_Halving())
    np.testing.assert_allclose(
        got.numpy(), R.attention(q.numpy(), k.numpy(), v.numpy(), causal=True, scale=8**-0.5 / 4), atol=1e-12
    )


def test_rope_through_attention_still_takes_its_own_call(monkeypatch):
    """RoPE's fused kernels run: attention calls the module itself with its positions and offset."""
    rope = RotaryEmbedding(8)
    seen = []
    monkeypatch.setattr(RotaryEmbedding, "forward", lambda self, q, k, **kw: seen.append(kw) or (q, k))
    q = _randn(1, 2, 4, 8)
    posenc.attention(q, q, q, rotary=rope, offset=3)
    assert seen == [{"positions": None, "k_positions": None, "offset": 3}]
