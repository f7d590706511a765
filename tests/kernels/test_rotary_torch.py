"""The fused CPU RoPE path (posenc.kernels) against posenc.reference and rotate_eager, gradients included."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import RotaryEmbedding, reference
from posenc.kernels import apply_rotary, apply_rotary_qk, rotary_torch, rotate_eager, rotate_into

TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2e-2}


def _tables(seq, r, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.rand(seq, r // 2, generator=gen, dtype=torch.float64) * 20
    return theta.cos().to(dtype), theta.sin().to(dtype)


@st.composite
def rope_case(draw):
    lead = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    seq = draw(st.integers(1, 19))
    head_dim = 2 * draw(st.integers(1, 12))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    layout = draw(st.sampled_from(["interleaved", "half"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    transposed = draw(
        st.booleans()
    )  # a (.., head_dim, seq) buffer seen through .transpose: not complex-viewable
    offset = draw(st.integers(0, 50))
    return lead, seq, head_dim, rotary_dim, layout, dtype, transposed, offset


@given(rope_case(), st.booleans())
def test_module_matches_reference(case, inplace):
    lead, seq, head_dim, rotary_dim, layout, dtype, transposed, offset = case
    gen = torch.Generator().manual_seed(1)
    shape = (*lead, seq, head_dim)
    if transposed:
        q = torch.randn(*lead, head_dim, seq, generator=gen).to(dtype).transpose(-1, -2)
    else:
        q = torch.randn(shape, generator=gen).to(dtype)
    k = torch.randn(shape, generator=gen).to(dtype)
    rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout)
    positions = np.arange(offset, offset + seq)
    want_q = reference.rope(q.double().numpy(), positions, layout=layout, rotary_dim=rotary_dim)
    want_k = reference.rope(k.double().numpy(), positions, layout=layout, rotary_dim=rotary_dim)
    q_in, k_in = q.clone(), k.clone()
    with torch.no_grad():
        got_q, got_k = rope(q_in, k_in, offset=offset, inplace=inplace)
    if inplace:
        assert got_q.data_ptr() == q_in.data_ptr() and got_k.data_ptr() == k_in.data_ptr()
    # Tolerance relative to the input's rounding: bfloat16 outputs are rounded once, to 8 bits.
    tol = TOL[dtype] * (1 + np.abs(want_q).max())
    np.testing.assert_allclose(got_q.double().numpy(), want_q, atol=tol, rtol=0)
    np.testing.assert_allclose(got_k.double().numpy(), want_k, atol=tol, rtol=0)
    # The fused path also agrees with the readable eager one in the input dtype.
    cos, sin = rope.cos_sin(
        seq, offset=offset, dtype=torch.float64 if dtype == torch.float64 else torch.float32
    )
    eager = rotate_eager(q, cos, sin, layout)
    assert (got_q.double() - eager.double()).abs().max() <= tol


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_path_many_blocks(monkeypatch, layout, dtype):
    """Force tiny cache blocks so the block loop runs many times, in place and out, with a batched table."""
    monkeypatch.setattr(rotary_torch, "_BLOCK_ELEMS", 64)
    x = torch.randn(2, 3, 37, 16).to(dtype)
    cos, sin = _tables(37, 12)
    cos_b, sin_b = (
        torch.stack((cos, cos.flip(0)))[:, None],
        torch.stack((sin, sin.flip(0)))[:, None],
    )  # (2, 1, 37, 6)
    want = rotate_eager(x, cos_b, sin_b, layout)
    out = rotate_into(x, cos_b, sin_b, torch.empty_like(x), layout)
    y = x.clone()
    rotate_into(y, cos_b, sin_b, y, layout)
    tol = TOL[dtype] * 8
    assert (out.float() - want.float()).abs().max() <= tol
    assert (y.float() - want.float()).abs().max() <= tol


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_conjugate_inverts(layout):
    x = torch.randn(2, 5, 10, dtype=torch.float64)
    cos, sin = _tables(5, 8, torch.float64)
    there = rotate_into(x, cos, sin, torch.empty_like(x), layout)
    back = rotate_into(there, cos, sin, torch.empty_like(x), layout, conjugate=True)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_gradcheck_qk_gqa_batched_positions(layout, rotary_dim):
    rope = RotaryEmbedding(8, rotary_dim=rotary_dim, layout=layout)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True)  # fewer kv heads
    positions = torch.tensor([[0.5, 1.0, 2.0, 3.5, 4.0], [7.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.autograd.gradcheck(lambda a, b: rope(a, b, positions=positions), (q, k))
    assert torch.autograd.gradcheck(lambda a, b: rope(a, b, offset=11), (q, k))


def test_backward_is_custom_and_matches_eager():
    rope = RotaryEmbedding(16, rotary_dim=12, layout="half")
    q = torch.randn(2, 3, 7, 16, requires_grad=True)
    k = torch.randn(2, 3, 7, 16, requires_grad=True)
    qo, ko = rope(q, k, offset=4)
    assert type(qo.grad_fn).__name__ == "RotaryFunctionBackward"
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    got = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    cos, sin = rope.cos_sin(7, offset=4)
    qe, ke = rotate_eager(q, cos, sin, "half"), rotate_eager(k, cos, sin, "half")
    want = torch.autograd.grad((qe, ke), (q, k), (gq, gk))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_unused_output_gets_zero_gradient():
    cos, sin = _tables(4, 6)
    q = torch.randn(1, 4, 6, requires_grad=True)
    k = torch.randn(1, 4, 6, requires_grad=True)
    qo, _ = apply_rotary_qk(q, k, cos, sin, layout="interleaved")
    (gq,) = torch.autograd.grad(qo.sum(), (q,))
    want = rotate_eager(torch.ones_like(q), cos, -sin, "interleaved")
    torch.testing.assert_close(gq, want)


def test_apply_rotary_single_and_qk_agree():
    cos, sin = _tables(6, 8)
    q, k = torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    qo, ko = apply_rotary_qk(q, k, cos, sin, layout="half")
    torch.testing.assert_close(qo, apply_rotary(q, cos, sin, layout="half"), rtol=0, atol=0)
    torch.testing.assert_close(ko, rotate_eager(k, cos, sin, "half"), rtol=0, atol=2e-6)


def test_inplace_refuses_tensors_that_need_grad():
    rope = RotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    with pytest.raises(ValueError, match="inplace=True overwrites q"):
        rope(q, torch.randn(1, 2, 3, 8), inplace=True)


def test_out_of_place_leaves_inputs_alone():
    rope = RotaryEmbedding(8, layout="half")
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    q0, k0 = q.clone(), k.clone()
    rope(q, k)
    assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.parametrize("shape", [(2, 3), (4, 16, 256, 128)])  # below and above the huge-page threshold
def test_empty_output_is_a_plain_writable_tensor_like_x(shape):
    from posenc.kernels.memory import empty_output

    x = torch.randn(shape).transpose(0, 1)
    out = empty_output(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.stride() == x.stride()
    out.copy_(x)
    assert torch.equal(out, x)
