"""AxialRotaryEmbedding (RoPE-Axial and RoPE-Mixed, Heo et al. 2024) against posenc.reference.axial_rope,
and the property that makes it a 2-D RoPE: attention scores depend only on the 2-D offset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import AxialRotaryEmbedding
from posenc import reference as R
from posenc.rope.axial import grid_positions


def qk(batch=2, heads=3, n=12, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, heads, n, d, generator=g, dtype=dtype), torch.randn(
        batch, heads, n, d, generator=g, dtype=dtype
    )


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("axes, grid", [(2, (3, 4)), (3, (2, 2, 3))])
def test_axial_matches_the_reference(axes, grid, layout):
    rot = AxialRotaryEmbedding(24, axes=axes, base=100.0, layout=layout)
    q, k = qk(n=2 + int(np.prod(grid)), d=24)
    qr, kr = rot(q, k, grid=grid, prefix_tokens=2)
    freqs = R.axial_frequencies(24, axes, 100.0)
    pos = grid_positions(*grid).numpy()
    np.testing.assert_allclose(qr.numpy(), R.axial_rope(q.numpy(), pos, freqs, layout, 2), atol=1e-5)
    np.testing.assert_allclose(kr.numpy(), R.axial_rope(k.numpy(), pos, freqs, layout, 2), atol=1e-5)
    assert torch.equal(qr[:, :, :2], q[:, :, :2]) and torch.equal(kr[:, :, :2], k[:, :, :2])  # class tokens


def test_mixed_matches_the_reference_and_learns():
    rot = AxialRotaryEmbedding(16, mixed=True, num_heads=3, base=10.0, seed=1)
    assert rot.freqs.shape == (2, 3, 8) and rot.freqs.requires_grad
    q, k = qk(n=1 + 9)
    qr, kr = rot(q, k, grid=(3, 3), prefix_tokens=1)
    freqs = rot.freqs.detach().numpy()
    pos = grid_positions(3, 3).numpy()
    np.testing.assert_allclose(
        qr.detach().numpy(), R.axial_rope(q.numpy(), pos, freqs, "interleaved", 1), atol=1e-5
    )
    (qr * kr).sum().backward()
    assert rot.freqs.grad is not None and float(rot.freqs.grad.abs().sum()) > 0
    with torch.no_grad():  # the fused path gives the same numbers
        q2, _ = rot(q, k, grid=(3, 3), prefix_tokens=1)
    torch.testing.assert_close(q2, qr.detach(), atol=1e-6, rtol=0)
    # the paper's initialisation: per head, two orthogonal directions with the axial magnitudes
    f = rot.freqs.detach().double()
    magnitude = 10.0 ** (-4.0 * np.arange(4) / 16)
    np.testing.assert_allclose(f[:, :, :4].norm(dim=0).numpy(), np.broadcast_to(magnitude, (3, 4)), rtol=1e-6)
    np.testing.assert_allclose((f[:, :, :4] * f[:, :, 4:]).sum(0).numpy(), 0, atol=1e-7)


def test_mixed_gradients_against_finite_differences():
    rot = AxialRotaryEmbedding(8, mixed=True, num_heads=1, seed=2).double()
    q, k = qk(batch=1, heads=1, n=4, d=8, dtype=torch.float64)
    pos = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.5, 2.0]], dtype=torch.float64)

    def scores(freqs):
        qr, kr = torch.func.functional_call(rot, {"freqs": freqs}, (q, k), {"positions": pos})
        return qr @ kr.transpose(-1, -2)

    assert torch.autograd.gradcheck(scores, (rot.freqs.detach().clone().requires_grad_(True),))


@settings(max_examples=20, deadline=None)
@given(
    mixed=st.booleans(),
    shift=st.tuples(st.integers(-20, 20), st.integers(-20, 20)),
    seed=st.integers(0, 1000),
)
def test_scores_depend_only_on_the_2d_offset(mixed, shift, seed):
    rot = AxialRotaryEmbedding(16, mixed=mixed, num_heads=2 if mixed else None, seed=seed)
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(1, 2, 5, 16, generator=g, dtype=torch.float64),
        torch.randn(1, 2, 5, 16, generator=g, dtype=torch.float64),
    )
    pos = torch.randint(0, 30, (5, 2), generator=g).to(torch.float64)
    moved = pos + torch.tensor(shift, dtype=torch.float64)
    with torch.no_grad():
        rot = rot.double()
        a = torch.matmul(*_rotated(rot, q, k, pos))
        b = torch.matmul(*_rotated(rot, q, k, moved))
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    # and they do depend on it: swapping two tokens' positions changes the scores
    with torch.no_grad():
        c = torch.matmul(*_rotated(rot, q, k, pos[[1, 0, 2, 3, 4]]))
    if not torch.equal(pos[0], pos[1]):
        assert float((c - a).abs().max()) > 1e-6


def _rotated(rot, q, k, pos):
    qr, kr = rot(q, k, positions=pos)
    return qr, kr.transpose(-1, -2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="axes"):
        AxialRotaryEmbedding(16, axes=4)
    with pytest.raises(ValueError, match=r"2 \* axes = 6"):
        AxialRotaryEmbedding(16, axes=3)
    with pytest.raises(ValueError, match="num_heads"):
        AxialRotaryEmbedding(16, mixed=True)
    with pytest.raises(ValueError, match="2 axes"):
        AxialRotaryEmbedding(24, axes=3, mixed=True, num_heads=2)
    rot = AxialRotaryEmbedding(16)
    q, k = qk(n=6)
    with pytest.raises(ValueError, match="exactly one"):
        rot(q, k)
    with pytest.raises(ValueError, match="2 sizes"):
        rot(q, k, grid=(6,))
    with pytest.raises(ValueError, match="prefix_tokens"):
        rot(q, k, grid=(2, 2))


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("grad", [True, False])
def test_rope_mixed_refuses_keys_with_fewer_heads_in_every_mode(kv_heads, grad):
    """Each RoPE-Mixed head rotates with its own frequencies, so a key head shared by several query heads
    has no one rotation: it was broadcast to the query heads with autograd on, left alone under no_grad,
    or crashed. Now it is refused the same way in both modes."""
    ax = AxialRotaryEmbedding(32, mixed=True, num_heads=4)
    q, k = torch.randn(1, 4, 16, 32), torch.randn(1, kv_heads, 16, 32)
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match="k must have num_heads=4 heads"):
        ax(q, k, grid=(4, 4))
