"""SinusoidalEncoding, LearnedEmbedding and NoPositionalEncoding against posenc.reference."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import LearnedEmbedding, NoPositionalEncoding, PositionError, SinusoidalEncoding
from posenc import reference as R


@given(
    st.integers(1, 4),
    st.integers(1, 50),
    st.sampled_from([2, 8, 32, 64]),
    st.integers(0, 5000),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_sinusoidal_matches_reference(batch, seq, d_model, offset, dtype):
    enc = SinusoidalEncoding(d_model)
    x = torch.zeros(batch, seq, d_model, dtype=dtype)
    out = enc(x, offset=offset)
    assert out.dtype == dtype and out.shape == x.shape
    ref = R.sinusoidal(offset + seq, d_model)[offset:]
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    np.testing.assert_allclose(out[0].double().numpy(), ref, atol=tol)


def test_sinusoidal_adds_to_input_and_has_no_parameters():
    enc = SinusoidalEncoding(16)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(enc(x) - x, torch.from_numpy(R.sinusoidal(5, 16)).float().expand(2, 5, 16))
    assert list(enc.parameters()) == [] and enc.state_dict() == {}


def test_sinusoidal_accurate_at_large_offsets():
    enc = SinusoidalEncoding(64)
    out = enc(torch.zeros(1, 3, 64), offset=2_000_000)
    p = np.arange(2_000_000, 2_000_003, dtype=np.float64)[:, None] * R.inverse_frequencies(64)[None]
    ref = np.empty((3, 64))
    ref[:, 0::2], ref[:, 1::2] = np.sin(p), np.cos(p)
    assert np.abs(out[0].double().numpy() - ref).max() < 1e-6
    assert enc.cached_rows() <= 1 << 16  # far rows are computed, not cached in a multi-GB table


def test_learned_adds_rows_and_raises_past_the_table():
    emb = LearnedEmbedding(8, 4)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(emb(x, offset=5), x + emb.weight[5:8])
    with pytest.raises(PositionError, match=r"position 8 .*max_len=8.*cannot extrapolate") as info:
        emb(x, offset=6)
    assert isinstance(info.value, IndexError)


def test_learned_has_max_len_times_d_model_parameters():
    emb = LearnedEmbedding(1024, 768)  # GPT-2 small: "about 800,000" position parameters
    assert sum(p.numel() for p in emb.parameters()) == 786_432


def test_learned_gradients_reach_only_used_rows():
    emb = LearnedEmbedding(10, 4)
    emb(torch.zeros(1, 3, 4), offset=2).sum().backward()
    used = emb.weight.grad.abs().sum(-1) > 0
    assert used.tolist() == [False, False, True, True, True] + [False] * 5


def test_no_positional_encoding_is_identity():
    x = torch.randn(2, 3, 4)
    assert NoPositionalEncoding()(x, offset=7) is x


@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=12, unique=True),
    st.booleans(),
)
def test_sinusoidal_at_given_positions_is_the_reference_row_of_each(positions, batched):
    # randomized positions (Ruoss et al. 2023): any set of positions, per sequence or shared
    enc = SinusoidalEncoding(16)
    pos = torch.tensor(positions)
    x = torch.zeros(2, len(positions), 16)
    out = enc(x, positions=pos.expand(2, -1) if batched else pos)
    expected = R.sinusoidal(5001, 16)[positions]
    np.testing.assert_allclose(out[0].numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(out[1].numpy(), expected, atol=1e-6)


def test_learned_at_given_positions_gathers_those_rows_and_checks_them():
    enc = LearnedEmbedding(10, 4)
    x = torch.zeros(1, 3, 4)
    out = enc(x, positions=torch.tensor([7, 2, 9]))
    torch.testing.assert_close(out[0], enc.weight.detach()[[7, 2, 9]])
    with pytest.raises(PositionError, match="position 10 is past the end of the learned position table"):
        enc(x, positions=torch.tensor([0, 1, 10]))
    with pytest.raises(ValueError, match="positions must be integers for a learned table"):
        enc(x, positions=torch.tensor([0.0, 1.5, 2.0]))
    with pytest.raises(ValueError, match=r"positions must have shape \(3,\)"):
        enc(x, positions=torch.tensor([0, 1]))
    assert torch.equal(NoPositionalEncoding()(x, positions=torch.tensor([4, 5, 6])), x)
