"""posenc.reference against direct, loop-by-loop transcriptions of the papers' formulas."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import reference as R


def sinusoidal_loops(max_len, d_model, base=10000.0):
    pe = np.zeros((max_len, d_model))
    for p in range(max_len):
        for k in range(d_model // 2):
            omega = 1.0 / base ** (2 * k / d_model)
            pe[p, 2 * k] = math.sin(p * omega)
            pe[p, 2 * k + 1] = math.cos(p * omega)
    return pe


def rotation(theta):
    return np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])


def rope_loops(x, positions, base=10000.0, layout="interleaved"):
    """Each pair multiplied by R(p * omega_k) rotation matrix (Su et al. 2021)."""
    seq, d = x.shape
    out = x.copy()
    for i, p in enumerate(positions):
        for k in range(d // 2):
            a, b = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + d // 2)
            omega = 1.0 / base ** (2 * k / d)
            out[i, [a, b]] = rotation(p * omega) @ x[i, [a, b]]
    return out


def alibi_slopes_paper(n):
    """The ALiBi paper's get_slopes (Press et al. 2021, github.com/ofirpress/attention_with_linear_biases)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes_paper(2 * closest)[0::2][: n - closest]


@given(st.integers(1, 40), st.sampled_from([2, 4, 8, 16, 30]), st.sampled_from([100.0, 10000.0, 500000.0]))
def test_sinusoidal_matches_formula(max_len, d_model, base):
    np.testing.assert_allclose(
        R.sinusoidal(max_len, d_model, base), sinusoidal_loops(max_len, d_model, base), atol=1e-12
    )


def test_sinusoidal_matches_a_hand_computed_table():
    pe = R.sinusoidal(100, 64)
    assert pe.min() >= -1 and pe.max() <= 1
    np.testing.assert_allclose(pe[:, 0] ** 2 + pe[:, 1] ** 2, 1.0)
    assert abs(pe[0, 0] - pe[1, 0]) == pytest.approx(math.sin(1.0))  # the fastest sine moves by sin(1)
    assert abs(pe[0, 62] - pe[1, 62]) < 2e-4  # the slowest sine barely moves


@given(
    st.integers(1, 12),
    st.sampled_from([2, 4, 8, 12]),
    st.sampled_from(["interleaved", "half"]),
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=1),
)
def test_rope_matches_rotation_matrices(seq, d, layout, start):
    rng = np.random.default_rng(seq * 100 + d)
    x = rng.normal(size=(seq, d))
    positions = start[0] + np.arange(seq) * 0.75
    np.testing.assert_allclose(
        R.rope(x, positions, layout=layout), rope_loops(x, positions, layout=layout), atol=1e-10
    )


def test_rope_matches_a_hand_computed_rotation():
    rng = np.random.default_rng(42)
    q, k = rng.normal(0, 1, (1, 8)), rng.normal(0, 1, (1, 8))
    dots = [
        (R.rope(q, np.array([m])) @ R.rope(k, np.array([n])).T)[0, 0]
        for m, n in [(0, 5), (3, 8), (10, 15), (50, 55)]
    ]
    np.testing.assert_allclose(dots, dots[0], atol=1e-12)


def test_rope_partial_leaves_the_rest():
    x = np.random.default_rng(0).normal(size=(5, 10))
    out = R.rope(x, np.arange(5), rotary_dim=6)
    np.testing.assert_array_equal(out[:, 6:], x[:, 6:])
    np.testing.assert_allclose(out[:, :6], rope_loops(x[:, :6], np.arange(5)), atol=1e-12)


@pytest.mark.parametrize("n", list(range(1, 33)) + [48, 64, 96])
def test_alibi_slopes_match_paper_code(n):
    np.testing.assert_allclose(R.alibi_slopes(n), alibi_slopes_paper(n), rtol=1e-14)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32])
def test_alibi_slopes_power_of_two_is_the_paper_formula(n):
    np.testing.assert_allclose(R.alibi_slopes(n), [2 ** (-8 * h / n) for h in range(1, n + 1)], rtol=1e-15)


def test_alibi_bias_matches_a_hand_computed_table():
    bias = R.alibi_bias(16, 4, causal=False)
    assert bias.shape == (4, 16, 16)
    np.testing.assert_allclose(bias[0, 8], -0.25 * np.abs(np.arange(16) - 8))
    causal = R.alibi_bias(16, 4, causal=True)
    assert np.isneginf(causal[:, 3, 4:]).all()
    np.testing.assert_array_equal(causal[:, 3, :4], bias[:, 3, :4])


def test_attention_matches_loops():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 5, 4)), rng.normal(size=(3, 7, 4)), rng.normal(size=(3, 7, 2))
    out = R.attention(q, k, v, causal=True)
    for h in range(3):
        for i in range(5):
            pos = 2 + i  # queries are the last 5 of 7 positions
            s = np.array([q[h, i] @ k[h, j] / 2.0 for j in range(pos + 1)])
            w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            np.testing.assert_allclose(out[h, i], w @ v[h, : pos + 1], atol=1e-12)


def test_sinusoidal_shift_matrix_moves_every_position():
    pe = R.sinusoidal(200, 16)
    m = R.sinusoidal_shift_matrix(7, 16)
    np.testing.assert_allclose(pe[7:], pe[:-7] @ m.T, atol=1e-10)


def test_alibi_bias_is_causal_by_default_like_the_module():
    # posenc.ALiBi.bias defaults to causal=True; the oracle must not silently differ.
    from posenc import ALiBi

    np.testing.assert_array_equal(R.alibi_bias(9, 3), R.alibi_bias(9, 3, causal=True))
    assert np.isneginf(R.alibi_bias(9, 3)[:, 0, 1:]).all()
    np.testing.assert_array_equal(np.isneginf(R.alibi_bias(9, 3)), np.isneginf(ALiBi(3).bias(9).numpy()))


def test_reference_takes_torch_tensors_as_numpy_arrays():
    import torch

    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 4))
    positions = np.arange(5)
    qt = torch.tensor(q, dtype=torch.float32, requires_grad=True)
    np.testing.assert_allclose(
        R.rope(qt, torch.arange(5)), R.rope(q.astype(np.float32), positions), rtol=0, atol=0
    )
    np.testing.assert_allclose(R.rope(torch.tensor(q).bfloat16(), positions).shape, q.shape)
    got = R.attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), causal=True)
    np.testing.assert_allclose(got, R.attention(q, k, v, causal=True), rtol=0, atol=0)
    np.testing.assert_allclose(R.softmax(torch.tensor(q)), R.softmax(q), rtol=0, atol=0)
    slopes = torch.tensor([0.5, 0.25])
    np.testing.assert_allclose(R.alibi_bias(4, 2, slopes=slopes), R.alibi_bias(4, 2, slopes=[0.5, 0.25]))
    assert isinstance(R.rope(qt, torch.arange(5)), np.ndarray)
