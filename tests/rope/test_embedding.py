"""RotaryEmbedding against posenc.reference.rope."""

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import RotaryEmbedding
from posenc import reference as R
from posenc.kernels import dispatch, native
from posenc.rope.table import CACHE_LIMIT

TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}


@st.composite
def rope_cases(draw):
    head_dim = draw(st.sampled_from([2, 4, 8, 16, 64]))
    rotary_dim = draw(st.sampled_from([d for d in (2, 4, 8, 16, 64) if d <= head_dim]))
    batch, heads, seq = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 9))
    kind = draw(st.sampled_from(["default", "offset", "integer", "fractional", "batched"]))
    return head_dim, rotary_dim, batch, heads, seq, kind


def positions_for(kind, batch, seq, rng):
    if kind == "default":
        return None, 0, np.arange(seq)
    if kind == "offset":
        return None, 37, 37 + np.arange(seq)
    if kind == "integer":
        p = rng.integers(0, 5000, size=seq)
        return torch.from_numpy(p), 0, p
    if kind == "fractional":
        p = rng.uniform(0, 3000, size=seq)
        return torch.from_numpy(p), 0, p
    p = rng.integers(0, 2000, size=(batch, seq))
    return torch.from_numpy(p), 0, p


@given(
    rope_cases(),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    st.sampled_from(["interleaved", "half"]),
)
def test_rotate_matches_reference(case, dtype, layout):
    head_dim, rotary_dim, batch, heads, seq, kind = case
    rng = np.random.default_rng(head_dim * 1000 + seq)
    x = torch.from_numpy(rng.normal(size=(batch, heads, seq, head_dim))).to(dtype)
    positions, offset, ref_positions = positions_for(kind, batch, seq, rng)
    rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout)
    out = rope.rotate(x, positions=positions, offset=offset)
    assert out.dtype == dtype and out.shape == x.shape
    ref = R.rope(x.double().numpy(), ref_positions, layout=layout, rotary_dim=rotary_dim)
    scale = max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(out.double().numpy(), ref, atol=TOL[dtype] * scale)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_forward_rotates_q_and_k_alike(layout):
    rope = RotaryEmbedding(16, layout=layout)
    q, k = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16)
    q2, k2 = rope(q, k, offset=3)
    torch.testing.assert_close(q2, rope.rotate(q, offset=3))
    torch.testing.assert_close(k2, rope.rotate(k, offset=3))


def test_decoding_key_longer_than_query():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    # k holds positions 4..8 (the cache and the new token); q is the new token, the last of them: 8
    q2, k2 = rope(q, k, offset=4)
    np.testing.assert_allclose(q2.numpy(), R.rope(q.double().numpy(), np.array([8])), atol=1e-6)
    np.testing.assert_allclose(k2.numpy(), R.rope(k.double().numpy(), 4 + np.arange(5)), atol=1e-6)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("start", [2_000_000, 5_000_000, 9_999_990])
def test_float32_accurate_at_millions_of_positions(layout, start):
    rope = RotaryEmbedding(128, layout=layout, base=10000.0)
    x = torch.randn(1, 2, 10, 128)
    positions = torch.arange(start, start + 10)
    out = rope.rotate(x, positions=positions)
    ref = R.rope(x.double().numpy(), positions.numpy(), layout=layout)
    assert np.abs(out.double().numpy() - ref).max() < 1e-5
    out_offset = rope.rotate(x[..., :1, :], offset=start)  # the cache path, grown to ~start
    ref_offset = R.rope(x[..., :1, :].double().numpy(), np.array([start]), layout=layout)
    assert np.abs(out_offset.double().numpy() - ref_offset).max() < 1e-5


def test_angles_not_formed_in_bfloat16_under_autocast():
    rope = RotaryEmbedding(64)
    x = torch.randn(1, 1, 4, 64)
    positions = torch.arange(3_000_000, 3_000_004)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = rope.rotate(x, positions=positions)
    ref = R.rope(x.double().numpy(), positions.numpy())
    assert np.abs(out.double().numpy() - ref).max() < 1e-5


def test_half_cast_of_module_keeps_tables_accurate():
    rope = RotaryEmbedding(32).to(torch.bfloat16).to(torch.float32)
    x = torch.randn(1, 1, 3, 32)
    positions = torch.arange(1_000_000, 1_000_003)
    ref = R.rope(x.double().numpy(), positions.numpy())
    assert np.abs(rope.rotate(x, positions=positions).double().numpy() - ref).max() < 1e-5


def test_cache_grows_and_is_not_saved():
    rope = RotaryEmbedding(16)
    rope.rotate(torch.randn(1, 1, 4, 16))
    small = rope.table.cached_rows()
    rope.rotate(torch.randn(1, 1, 4, 16), offset=small + 100)
    assert rope.table.cached_rows() >= small + 104
    assert rope.state_dict() == {}
    assert sum(p.numel() for p in rope.parameters()) == 0


def test_gradients_flow_and_match_reference_jacobian():
    rope = RotaryEmbedding(8, layout="half", rotary_dim=4)
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    q2, k2 = rope(q, k)
    (q2 * k2).sum().backward()
    # q and k share positions, so <R q, R k> = <q, k> and its gradient w.r.t. q is k itself
    torch.testing.assert_close(q.grad, k.detach())
    torch.testing.assert_close(k.grad, q.detach())
    assert torch.autograd.gradcheck(lambda a: rope.rotate(a), (q,))


def test_interleaved_and_half_agree_after_permutation():
    d = 16
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # interleaved dim order -> half order
    x = torch.randn(2, 3, 7, d, dtype=torch.float64)
    inter = RotaryEmbedding(d, layout="interleaved").rotate(x)
    half = RotaryEmbedding(d, layout="half").rotate(x[..., perm])
    torch.testing.assert_close(half, inter[..., perm])


@contextlib.contextmanager
def _no_small_path():
    saved = dispatch.SMALL_ELEMENTS
    dispatch.SMALL_ELEMENTS = 0
    try:
        assert dispatch.choose_path((torch.zeros(1, 2),), "half", rows=True) is not dispatch.Path.SMALL
        yield
    finally:
        dispatch.SMALL_ELEMENTS = saved


@given(
    layout=st.sampled_from(["interleaved", "half"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    q_len=st.integers(0, 6),
    extra_k=st.integers(0, 4),
    offset=st.integers(0, 300),
    heads=st.sampled_from([(2, 2), (4, 1)]),
)
def test_small_tensor_path_equals_the_fused_path_and_the_reference(
    layout, dtype, q_len, extra_k, offset, heads
):
    """Decode-sized calls take a three-op path; it must give the fused path's numbers (float32 arithmetic)."""
    rope = RotaryEmbedding(16, layout=layout)
    gen = torch.Generator().manual_seed(q_len * 31 + offset)
    q = torch.randn(2, heads[0], q_len, 16, generator=gen).to(dtype)
    k = torch.randn(2, heads[1], q_len + extra_k, 16, generator=gen).to(dtype)
    with native.disabled():  # the small path is the torch one the compiled op would replace
        small = rope(q, k, offset=offset)
    with _no_small_path():
        fused = rope(q, k, offset=offset)
    for a, b in zip(small, fused, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6 if dtype == torch.float32 else 2**-6)
    k_pos = offset + np.arange(q_len + extra_k)
    want = R.rope(k.double().numpy(), k_pos, layout=layout)
    np.testing.assert_allclose(small[1].double().numpy(), want, atol=TOL[dtype] * 4)
    want_q = R.rope(q.double().numpy(), k_pos[extra_k:], layout=layout)  # the last q_len key positions
    np.testing.assert_allclose(small[0].double().numpy(), want_q, atol=TOL[dtype] * 4)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_small_tensor_path_gradients_and_double_backward(layout):
    rope = RotaryEmbedding(8, layout=layout)
    q = torch.randn(1, 2, 3, 8, dtype=torch.float32, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, dtype=torch.float32, requires_grad=True)
    with native.disabled():
        qo, ko = rope(q, k, offset=5)
    assert "Rotary" not in type(qo.grad_fn).__name__  # the small path, not the autograd Function
    (qo * ko.expand_as(qo)).sum().backward()
    # <R q, R k> = <q, k> at shared positions: the gradient w.r.t. q is k
    torch.testing.assert_close(q.grad, k.detach().expand_as(q), rtol=0, atol=1e-6)
    x = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a: rope.rotate(a), (x,))


def test_queries_without_positions_sit_at_the_last_key_positions_of_their_sequence():
    """Left-padded decoding: key positions per sequence, no query positions given; each sequence's queries
    are its last keys, at their positions (not at the last slots of the padded row)."""
    rope = posenc.RotaryEmbedding(8)
    q = torch.randn(2, 3, 2, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    kp = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    qr, kr = rope(q, k, k_positions=kp, offset=7)
    for b in range(2):
        np.testing.assert_allclose(qr[b].numpy(), R.rope(q[b].numpy(), kp[b, -2:].numpy() + 7), atol=1e-12)
        np.testing.assert_allclose(kr[b].numpy(), R.rope(k[b].numpy(), kp[b].numpy() + 7), atol=1e-12)


def test_a_left_padded_decode_step_through_attention_equals_the_unpadded_one():
    rope = posenc.RotaryEmbedding(8)
    q, k, v = (torch.randn(1, 2, n, 8, dtype=torch.float64) for n in (1, 4, 4))
    pad = torch.zeros(1, 2, 2, 8, dtype=torch.float64)
    kp = torch.tensor([[0, 0, 0, 1, 2, 3]])
    mask = torch.tensor([[False, False, True, True, True, True]])
    padded = posenc.attention(
        q, torch.cat((pad, k), 2), torch.cat((pad, v), 2), rotary=rope, k_positions=kp, bias=mask[:, None]
    )
    torch.testing.assert_close(padded, posenc.attention(q, k, v, rotary=rope), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("offset", [10**7, 10**12])
def test_a_far_offset_costs_what_a_near_one_does(offset):
    """A one-token call at a far offset used to grow the decode-path memo from 0 to the offset: 94 s and
    19.5 GiB at 10^7, an 8 TB allocation at 10^12. It is now sized by the tensors, and still exact."""
    rope = RotaryEmbedding(128)
    q = torch.randn(1, 2, 1, 128)
    qr, kr = rope(q, q, offset=offset)
    assert rope.table.cached_rows() <= CACHE_LIMIT and not rope.table._laid_out
    want = R.rope(q.double().numpy(), np.array([offset], dtype=np.float64))
    # float64 angles: exact to float32 at 10^7; at 10^12 the angle itself holds ~1e-4 rad
    np.testing.assert_allclose(qr.double().numpy(), want, atol=1e-6 if offset < 10**9 else 2e-4)
    out = posenc.attention(q, q, q, rotary=rope, offset=offset)
    assert out.shape == q.shape and not rope.table._laid_out


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("seq", [4, 4096])  # the decode-sized path and the fused one
def test_a_strided_last_dimension_rotates_like_its_contiguous_copy(layout, seq):
    """Every other column of a wider tensor (stride 2) raised "Tensor must have a last dimension with stride
    1" on the interleaved decode path."""
    rope = RotaryEmbedding(64, layout=layout)
    wide = torch.randn(1, 2, seq, 128)
    strided = wide[..., ::2]
    with native.disabled():
        got = rope(strided, strided)
        want = rope(strided.contiguous(), strided.contiguous())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    # by default the contiguous copy may take the compiled op: its float32 rounding may differ in the last bit
    for g, w in zip(got, rope(strided.contiguous(), strided.contiguous()), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_on_a_decode_step_writes_the_out_of_place_rotation_into_q_and_k(layout, dtype):
    rope = posenc.RotaryEmbedding(8, layout=layout)
    q, k = torch.randn(2, 4, 1, 8, dtype=dtype), torch.randn(2, 2, 1, 8, dtype=dtype)
    want = rope(q, k, offset=37)
    got = rope(q, k, offset=37, inplace=True)
    assert got[0] is q and got[1] is k
    torch.testing.assert_close(q, want[0], rtol=0, atol=0)
    torch.testing.assert_close(k, want[1], rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 1])
def test_in_place_on_strided_views_of_a_packed_tensor_rotates_only_the_views(layout, dtype, start):
    """q and k as slices of one packed qkv row (an odd start breaks the complex view): in place writes the
    out-of-place rotation into the slices and leaves the rest of the packed tensor alone."""
    rope = posenc.RotaryEmbedding(8, layout=layout)
    packed = torch.randn(2, 3, 1, 8 * 3 + 1, dtype=dtype)
    before = packed.clone()
    q, k = packed[..., start : start + 8], packed[..., start + 8 : start + 16]
    want = rope(q.clone(), k.clone(), offset=5)
    got = rope(q, k, offset=5, inplace=True)
    assert got[0].data_ptr() == q.data_ptr() and got[1].data_ptr() == k.data_ptr()
    torch.testing.assert_close(packed[..., start : start + 8], want[0], rtol=0, atol=0)
    torch.testing.assert_close(packed[..., start + 8 : start + 16], want[1], rtol=0, atol=0)
    untouched = torch.ones(packed.shape[-1], dtype=torch.bool)
    untouched[start : start + 16] = False
    torch.testing.assert_close(packed[..., untouched], before[..., untouched], rtol=0, atol=0)
