"""The compiled CPU op (posenc.kernels.native) against posenc.reference (numpy, float64) and rotate_eager."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import RotaryEmbedding, reference
from posenc.kernels import Path, apply_rotary, apply_rotary_qk, choose_path, native, rotate_eager
from posenc.kernels.native import build

if os.environ.get("CI") and build.compiler() and os.environ.get("POSENC_DISABLE_NATIVE") != "1":
    # CI built it in `make install`: a missing op there is a failure, not a skip
    assert native.available(), native.status()
pytestmark = pytest.mark.skipif(not native.available(), reason=f"compiled CPU op: {native.status()}")

# One rounding of a float32 result to the storage dtype, relative to the largest output.
TOL = {torch.float64: 1e-13, torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-11}
DTYPES = list(TOL)


@st.composite
def native_case(draw):
    lead = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    seq = draw(st.integers(1, 9))
    head_dim = 2 * draw(st.integers(1, 20))
    rotary_dim = 2 * draw(st.integers(0, head_dim // 2))
    layout = draw(st.sampled_from(["interleaved", "half"]))
    dtype = draw(st.sampled_from(DTYPES))
    permuted = draw(st.booleans()) and len(lead) >= 1  # heads and seq swapped in memory, unit last stride
    per_sequence = draw(st.booleans()) and len(lead) >= 1  # positions (batch, seq): a table per sequence
    return lead, seq, head_dim, rotary_dim, layout, dtype, permuted, per_sequence


def _input(lead, seq, head_dim, dtype, permuted, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if permuted:  # (..., seq, lead[-1], d) in memory, seen as (..., lead[-1], seq, d)
        x = torch.randn(*lead[:-1], seq, lead[-1], head_dim, generator=gen).to(dtype).transpose(-3, -2)
        assert x.stride(-1) == 1 and not x.is_contiguous() or 1 in x.shape[-3:-1]
        return x
    return torch.randn(*lead, seq, head_dim, generator=gen).to(dtype)


@given(native_case(), st.booleans(), st.booleans())
def test_the_op_matches_the_reference_and_the_eager_formula(case, inplace, conjugate):
    lead, seq, head_dim, rotary_dim, layout, dtype, permuted, per_sequence = case
    x = _input(lead, seq, head_dim, dtype, permuted)
    gen = torch.Generator().manual_seed(seq)
    positions = torch.randint(0, 5000, (lead[0], seq) if per_sequence else (seq,), generator=gen)
    rope = RotaryEmbedding(head_dim, rotary_dim=max(rotary_dim, 2), layout=layout)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = rope.cos_sin(positions, dtype=work)
    cos, sin = cos[..., : rotary_dim // 2], sin[..., : rotary_dim // 2]
    if per_sequence:  # (batch, seq, r/2) lined up with x's first axis
        cos, sin = (t.reshape(lead[0], *(1,) * (len(lead) - 1), seq, -1) for t in (cos, sin))
    sign = -1.0 if conjugate else 1.0
    out = x.clone() if inplace else torch.empty_like(x)
    native.rotary([out if inplace else x], [out], cos, sin, layout == "interleaved", conjugate)
    want = x.double().numpy()
    if rotary_dim:
        want = reference.rope(want, sign * positions.double().numpy(), layout=layout, rotary_dim=rotary_dim)
    tol = TOL[dtype] * (1 + np.abs(want).max())
    np.testing.assert_allclose(out.double().numpy(), want, atol=tol, rtol=0)
    if rotary_dim:  # the same arithmetic as the readable formula, one rounding: equal to its last unit
        eager = rotate_eager(x, cos, sign * sin, layout)
        torch.testing.assert_close(out, eager, rtol=0, atol=TOL[dtype] * (1 + eager.abs().max().item()))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_q_and_k_of_different_widths_in_one_call_equal_two_calls(layout, dtype):
    q = torch.randn(2, 8, 33, 64).to(dtype)
    k = torch.randn(2, 2, 33, 64).to(dtype)
    theta = torch.rand(33, 24, dtype=torch.float64) * 30  # partial rotary: 48 of 64 dimensions
    work = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = theta.cos().to(work), theta.sin().to(work)
    both = apply_rotary_qk(q, k, cos, sin, layout=layout)
    for x, got in zip((q, k), both, strict=True):
        torch.testing.assert_close(got, apply_rotary(x, cos, sin, layout=layout), rtol=0, atol=0)
        assert torch.equal(got[..., 48:], x[..., 48:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_threads_share_the_work_without_changing_a_bit(dtype):
    """The suite runs one thread per worker; a call big enough to be split must give the serial result."""
    q = torch.randn(2, 8, 1024, 64).to(dtype)  # with k 1.3 M elements: above the serial threshold
    k = torch.randn(2, 2, 1024, 64).to(dtype)
    theta = torch.rand(1024, 32, dtype=torch.float64) * 100
    cos, sin = theta.cos().float(), theta.sin().float()
    serial = apply_rotary_qk(q, k, cos, sin, layout="half")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        split = apply_rotary_qk(q, k, cos, sin, layout="half")
        q2, k2 = q.clone(), k.clone()
        apply_rotary_qk(q2, k2, cos, sin, layout="half", inplace=True)
    finally:
        torch.set_num_threads(threads)
    for a, b, c in zip(serial, split, (q2, k2), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_gradients_are_the_conjugate_rotation(layout):
    rope = RotaryEmbedding(12, rotary_dim=8, layout=layout)
    x = torch.randn(2, 3, 5, 12, dtype=torch.float64, requires_grad=True)
    assert choose_path((x,), layout, cos=torch.zeros(5, 4, dtype=torch.float64)) is Path.NATIVE
    assert torch.autograd.gradcheck(lambda a: rope.rotate(a, offset=3), (x,))
    assert torch.autograd.gradgradcheck(lambda a: rope.rotate(a, offset=3), (x,))


def test_dispatch_takes_the_op_where_it_fits_and_torch_elsewhere():
    x = torch.randn(2, 4, 8, 16)
    cos = torch.zeros(8, 8)
    assert choose_path((x,), "half", cos=cos) is Path.NATIVE
    assert (
        choose_path((x.transpose(-1, -2).contiguous().transpose(-1, -2),), "half", cos=cos) is not Path.NATIVE
    )
    assert choose_path((x, x.double()), "half", cos=cos) is not Path.NATIVE  # one dtype per call
    with native.disabled():
        assert choose_path((x,), "half", cos=cos) is not Path.NATIVE
        assert native.status() == "off (POSENC_DISABLE_NATIVE=1)"


def test_a_library_for_another_torch_is_refused_with_the_way_to_rebuild(tmp_path, monkeypatch):
    library, record = tmp_path / build.LIBRARY.name, tmp_path / build.RECORD.name
    shutil.copy(build.LIBRARY, library)
    record.write_text(json.dumps({**build.expected_record(), "torch": "1.0.0"}))
    monkeypatch.setattr(build, "LIBRARY", library)
    monkeypatch.setattr(build, "RECORD", record)
    why = native.why_not_loadable()
    assert "another torch" in why and "make install" in why
    record.write_text(json.dumps(build.expected_record()))
    assert native.why_not_loadable() is None
    library.unlink()
    assert "not built" in native.why_not_loadable()
