"""The Triton RoPE kernel's cases, collected by test_rotary_triton.py on CUDA or in its interpreted child run.

Not collected by default (no ``test_`` prefix): on a CPU-only machine these need ``TRITON_INTERPRET=1``
set before triton is imported, which only a fresh process can give.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc import RotaryEmbedding, reference
from posenc.angles import angles, inverse_frequencies
from posenc.kernels import rotate_eager

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LAYOUTS = [pytest.param(True, id="interleaved"), pytest.param(False, id="half")]
B, HQ, HK, L, D = 2, 2, 1, 6, 8


def _table(n: int, r: int, dtype=torch.float32):
    theta = angles(torch.arange(n), inverse_frequencies(r, 10000.0))
    return theta.cos().to(dtype), theta.sin().to(dtype)


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _close(got, want, tol):
    got = got.detach().cpu().double().numpy()
    want = want.detach().cpu().double().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


def _ref(x, positions, interleaved, r):
    return reference.rope(x.numpy(), positions, layout="interleaved" if interleaved else "half", rotary_dim=r)


def _kernel():
    from posenc.kernels.rotary_triton import rotary_qk_triton

    return rotary_qk_triton


@pytest.mark.parametrize("r", [8, 6], ids=["full", "partial"])
@pytest.mark.parametrize("interleaved", LAYOUTS)
def test_q_and_k_with_different_head_counts_and_an_int_offset(interleaved, r):
    cos, sin = _table(64, r)
    q, k = _randn(B, HQ, L, D), _randn(B, HK, L, D, seed=1)
    qo, ko = _kernel()(
        q.to(DEV), k.to(DEV), cos.to(DEV), sin.to(DEV), interleaved=interleaved, seqlen_offsets=5
    )
    pos = np.arange(5, 5 + L)
    _close(qo, _ref(q, pos, interleaved, r), 1e-5)
    _close(ko, _ref(k, pos, interleaved, r), 1e-5)


@pytest.mark.parametrize("r", [8, 6], ids=["full", "partial"])
@pytest.mark.parametrize("interleaved", LAYOUTS)
def test_per_sequence_offsets(interleaved, r):
    cos, sin = _table(64, r)
    q, k = _randn(B, HQ, L, D), _randn(B, HK, L, D, seed=1)
    offs = torch.tensor([3, 20])
    qo, ko = _kernel()(
        q.to(DEV), k.to(DEV), cos.to(DEV), sin.to(DEV), interleaved=interleaved, seqlen_offsets=offs.to(DEV)
    )
    for b in range(B):
        p = np.arange(int(offs[b]), int(offs[b]) + L)
        _close(qo[b], _ref(q[b], p, interleaved, r), 1e-5)
        _close(ko[b], _ref(k[b], p, interleaved, r), 1e-5)


@pytest.mark.parametrize("r", [8, 6], ids=["full", "partial"])
@pytest.mark.parametrize("interleaved", LAYOUTS)
def test_packed_variable_length_sequences(interleaved, r):
    cos, sin = (t.to(DEV) for t in _table(64, r))
    cu = torch.tensor([0, 3, 10, 11], dtype=torch.int32)
    qp, kp = _randn(HQ, 11, D), _randn(HK, 11, D, seed=1)
    qo, ko = _kernel()(
        qp.to(DEV), kp.to(DEV), cos, sin, interleaved=interleaved, cu_seqlens=cu.to(DEV), max_seqlen=7
    )
    for s in range(3):  # each sequence restarts at position 0
        a, e = int(cu[s]), int(cu[s + 1])
        _close(qo[:, a:e], _ref(qp[:, a:e], np.arange(e - a), interleaved, r), 1e-5)
        _close(ko[:, a:e], _ref(kp[:, a:e], np.arange(e - a), interleaved, r), 1e-5)
    # (total, heads, head_dim) packing is the same kernel on a transposed view
    qt = qp.transpose(0, 1).contiguous().to(DEV)
    qo_t, _ = _kernel()(qt.transpose(0, 1), None, cos, sin, interleaved=interleaved, cu_seqlens=cu.to(DEV))
    _close(qo_t, qo, 0.0)


@pytest.mark.parametrize("r", [8, 6], ids=["full", "partial"])
@pytest.mark.parametrize("interleaved", LAYOUTS)
def test_in_place_bfloat16_and_batched_tables(interleaved, r):
    cos, sin = _table(64, r)
    layout = "interleaved" if interleaved else "half"
    q = _randn(B, HQ, L, D)
    q2 = q.clone().to(DEV)
    _kernel()(q2, None, cos.to(DEV), sin.to(DEV), interleaved=interleaved, inplace=True)
    _close(q2, _ref(q, np.arange(L), interleaved, r), 1e-5)
    # bfloat16: float32 arithmetic, one rounding; values below 8 are within 2^-5 (one ulp) of the eager result
    qb = q.to(torch.bfloat16)
    qo, _ = _kernel()(qb.to(DEV), None, cos.to(DEV), sin.to(DEV), interleaved=interleaved)
    _close(qo, rotate_eager(qb, cos[:L], sin[:L], layout), 2**-5)
    # a batched table (batch, table_len, r/2), as batched positions give
    cb, sb = torch.stack((cos, cos.flip(0))), torch.stack((sin, sin.flip(0)))
    qo, _ = _kernel()(q.to(DEV), None, cb.to(DEV), sb.to(DEV), interleaved=interleaved)
    for b in range(B):
        _close(qo[b], rotate_eager(q[b], cb[b, :L], sb[b, :L], layout), 1e-6)


@pytest.mark.parametrize("interleaved", LAYOUTS)
def test_gradcheck_through_the_autograd_function(interleaved):
    """Backward = the same kernel with sin negated, in float64, with per-sequence offsets and packed
    sequences."""
    from posenc.kernels.rotary_triton import apply_rotary_triton

    cos, sin = (t.to(DEV) for t in _table(16, 6, torch.float64))
    q = _randn(1, 2, 3, 8, dtype=torch.float64).to(DEV).requires_grad_()
    k = _randn(1, 1, 3, 8, dtype=torch.float64, seed=1).to(DEV).requires_grad_()
    offs = torch.tensor([2], device=DEV)

    def fn(a, b):
        return apply_rotary_triton(a, b, cos, sin, interleaved=interleaved, seqlen_offsets=offs)

    assert torch.autograd.gradcheck(fn, (q, k))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEV)
    qp = _randn(1, 5, 8, dtype=torch.float64).to(DEV).requires_grad_()

    def fn_varlen(a):
        return apply_rotary_triton(a, None, cos, sin, interleaved=interleaved, cu_seqlens=cu, max_seqlen=3)[0]

    assert torch.autograd.gradcheck(fn_varlen, (qp,))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_module_dispatches_to_triton_and_matches_eager_with_gradients(layout, monkeypatch):
    monkeypatch.setattr("posenc.kernels.dispatch.SMALL_ELEMENTS", 0)  # CPU tensors under the interpreter
    rope = RotaryEmbedding(8, rotary_dim=6, layout=layout)
    q = _randn(2, 2, 5, 8).to(DEV).requires_grad_()
    k = _randn(2, 1, 5, 8, seed=1).to(DEV).requires_grad_()
    positions = torch.tensor([[float(i) for i in range(5)], [float(2 * i) for i in range(5)]], device=DEV)
    qo, ko = rope(q, k, positions=positions)
    cos, sin = rope.cos_sin(5, positions)
    cos, sin = cos[:, None], sin[:, None]
    _close(qo, rotate_eager(q, cos, sin, layout), 1e-6)
    gq, gk = torch.autograd.grad((qo.sum(), (2 * ko).sum()), (q, k))
    qe, ke = rotate_eager(q, cos, sin, layout), rotate_eager(k, cos, sin, layout)
    wq, wk = torch.autograd.grad((qe.sum(), (2 * ke).sum()), (q, k))
    _close(gq, wq, 1e-6)
    _close(gk, wk, 1e-6)


def test_q_and_k_with_different_head_counts_take_one_launch(monkeypatch):
    import posenc.kernels.rotary_triton as rt

    launches = []
    original = rt.rotary_qk_triton

    def counting(*args, **kwargs):
        launches.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(rt, "rotary_qk_triton", counting)
    monkeypatch.setattr("posenc.kernels.dispatch.SMALL_ELEMENTS", 0)
    RotaryEmbedding(8)(_randn(1, 2, 3, 8).to(DEV), _randn(1, 1, 3, 8).to(DEV))
    assert len(launches) == 1
