"""The rotary base (posenc.rope.base.Rotary): a new rotary is a subclass that overrides tables() alone and
works through posenc.attention(rotary=...); posenc's five are the base's dispatch over their own tables.
Every expected value is computed here with numpy (posenc.reference), never copied from posenc's output."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

import posenc
from posenc import (
    AxialRotaryEmbedding,
    FoPE,
    MRotaryEmbedding,
    RotaryEmbedding,
    RotaryProtocol,
    XPos,
)
from posenc import reference as R
from posenc.rope import Rotary


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


class LogRotary(Rotary):
    """A rotary of one's own: pair k of a vector at position p turns by log(1 + p) * omega_k (half pairs).
    Nothing but the tables: forward, rotate, the placement of queries and keys and the kernels are the
    base's."""

    def __init__(self, head_dim: int, base: float = 100.0):
        super().__init__()
        self.head_dim, self.layout = head_dim, "half"
        self.omega = torch.tensor(R.inverse_frequencies(head_dim, base))

    def tables(self, x, positions=None, offset=0, *, kind="q"):
        seq = x.shape[-2]
        p = torch.arange(offset, offset + seq) if positions is None else positions + offset
        theta = torch.log1p(p.double())[..., None] * self.omega  # (seq, head_dim/2)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return torch.cos(theta).to(dtype), torch.sin(theta).to(dtype)


def _log_rope(x: torch.Tensor, positions) -> np.ndarray:
    """numpy: x rotated by log(1 + p) * omega: R.rope's theta = p' * omega with p' = log(1 + p)."""
    angle = np.log1p(np.asarray(positions, dtype=np.float64))
    omega = R.inverse_frequencies(x.shape[-1], 100.0)
    return R.rope(x.double().numpy(), angle, layout="half", inv_freq=omega)


def test_a_subclass_overriding_the_hook_alone_is_a_rotary():
    own = {name for name in vars(LogRotary) if not name.startswith("__")}
    assert own == {"tables"}
    rot = LogRotary(8)
    assert isinstance(rot, RotaryProtocol) and posenc.rope.protocol.is_rotary(rot)
    x = _randn(2, 3, 5, 8)
    np.testing.assert_allclose(rot.rotate(x, offset=4).numpy(), _log_rope(x, np.arange(4, 9)), atol=1e-12)
    p = torch.tensor([7, 0, 3, 3, 11])
    np.testing.assert_allclose(rot.rotate(x, p).numpy(), _log_rope(x, p.numpy()), atol=1e-12)
    cos, sin = rot.cos_sin(p)  # the protocol's tables, from the same hook: (seq, head_dim/2) float32
    theta = np.log1p(p.numpy().astype(np.float64))[:, None] * R.inverse_frequencies(8, 100.0)
    assert cos.shape == (5, 4) and cos.dtype == torch.float32
    np.testing.assert_allclose(cos.numpy(), np.cos(theta), atol=1e-7)
    np.testing.assert_allclose(sin.numpy(), np.sin(theta), atol=1e-7)


@pytest.mark.parametrize("q_len, k_len, offset", [(6, 6, 0), (2, 7, 3), (1, 9, 20)])
def test_a_new_rotary_through_attention_equals_numpy(q_len, k_len, offset):
    """Keys at offset.., queries the last q_len of them (bottom-right), as attention places them."""
    rot = LogRotary(8)
    q, k, v = _randn(2, 4, q_len, 8), _randn(2, 2, k_len, 8, seed=1), _randn(2, 2, k_len, 8, seed=2)
    got = posenc.attention(q, k, v, rotary=rot, offset=offset)
    keys = np.arange(offset, offset + k_len)
    rq, rk = _log_rope(q, keys[k_len - q_len :]), _log_rope(k, keys)
    rk, rv = np.repeat(rk, 2, axis=1), np.repeat(v.numpy(), 2, axis=1)  # grouped-query: 2 queries per key
    np.testing.assert_allclose(got.numpy(), R.attention(rq, rk, rv, causal=True), atol=1e-12)


def test_a_new_rotary_at_given_positions_and_its_gradients():
    rot = LogRotary(8)
    q, k, v = _randn(1, 2, 3, 8), _randn(1, 2, 6, 8, seed=1), _randn(1, 2, 6, 8, seed=2)
    kp = torch.tensor([0, 2, 5, 6, 9, 14])
    got = posenc.attention(q, k, v, rotary=rot, k_positions=kp)  # queries: the last 3 key positions
    rq, rk = _log_rope(q, kp[3:].numpy()), _log_rope(k, kp.numpy())
    np.testing.assert_allclose(got.numpy(), R.attention(rq, rk, v.numpy(), causal=True), atol=1e-12)
    qp = torch.tensor([1, 4, 8])
    qr, kr = rot(q, k, positions=qp, k_positions=kp)
    np.testing.assert_allclose(qr.numpy(), _log_rope(q, qp.numpy()), atol=1e-12)
    np.testing.assert_allclose(kr.numpy(), _log_rope(k, kp.numpy()), atol=1e-12)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rot(a, b, positions=qp, k_positions=kp), (qg, kg))


def test_a_subclass_without_tables_says_so():
    class Empty(Rotary):
        head_dim, layout = 8, "half"

    with pytest.raises(NotImplementedError, match=r"Empty must define tables"):
        Empty()(_randn(1, 1, 2, 8), _randn(1, 1, 2, 8))


@pytest.mark.parametrize("cls", [RotaryEmbedding, XPos, MRotaryEmbedding, AxialRotaryEmbedding, FoPE])
def test_the_five_are_the_base_dispatch_over_their_own_tables(cls):
    assert issubclass(cls, Rotary) and "tables" in vars(cls)
    assert "rotate" not in vars(cls)
    if cls is AxialRotaryEmbedding:  # its public signature takes the grid first; the body is the base's
        assert "super().forward(" in _source(cls.forward)
    else:
        assert cls.forward is Rotary.forward


def _source(fn) -> str:
    return inspect.getsource(fn)


@pytest.mark.parametrize("centre", [None, 3.0])
def test_xpos_queries_sit_at_the_last_key_positions_as_rope_places_them(centre):
    """xPos places queries and keys as RoPE does (its docstring's contract): with k_positions alone, the
    queries are the last q_len key positions, scaled about the keys' middle (or the given centre)."""
    xpos = XPos(8, scale_base=16)
    q, k = _randn(1, 2, 3, 8), _randn(1, 2, 6, 8, seed=1)
    kp = torch.tensor([0, 2, 5, 6, 9, 14])
    qr, kr = xpos(q, k, k_positions=kp, centre=centre)
    c = math.ceil((0 + 14) / 2) if centre is None else centre
    np.testing.assert_allclose(
        qr.numpy(), R.xpos(q.numpy(), kp[3:].numpy(), "q", c, scale_base=16), atol=1e-12
    )
    np.testing.assert_allclose(kr.numpy(), R.xpos(k.numpy(), kp.numpy(), "k", c, scale_base=16), atol=1e-12)
