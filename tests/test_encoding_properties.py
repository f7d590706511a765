"""Every property the papers state about each encoding, checked on the torch modules."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import reference as R

D, H = 16, 2


class TinySelfAttention(torch.nn.Module):
    """One bidirectional self-attention layer with an optional positional scheme."""

    def __init__(self, scheme: str, seq: int):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.wq, self.wk, self.wv = (
            torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(3)
        )
        self.scheme = scheme
        self.absolute = {
            "sinusoidal": posenc.SinusoidalEncoding(D),
            "learned": posenc.LearnedEmbedding(seq, D).double(),
        }.get(scheme, posenc.NoPositionalEncoding())
        self.rotary = posenc.RotaryEmbedding(D // H) if scheme == "rope" else None
        self.alibi = posenc.ALiBi(H) if scheme == "alibi" else None

    def forward(self, x):  # x (seq, D)
        x = self.absolute(x[None])[0]
        split = lambda t: t.view(-1, H, D // H).transpose(0, 1)[None]  # noqa: E731
        q, k, v = split(x @ self.wq), split(x @ self.wk), split(x @ self.wv)
        out = posenc.attention(q, k, v, rotary=self.rotary, bias=self.alibi, causal=False)
        return out[0].transpose(0, 1).reshape(-1, D)


@pytest.mark.parametrize("seed", range(3))
def test_attention_without_position_is_permutation_equivariant(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, D, generator=g, dtype=torch.float64)
    perm = torch.randperm(9, generator=g)
    layer = TinySelfAttention("none", 9)
    torch.testing.assert_close(layer(x[perm]), layer(x)[perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", ["sinusoidal", "learned", "rope", "alibi"])
def test_each_encoding_breaks_permutation_equivariance(scheme):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, D, generator=g, dtype=torch.float64)
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 6, 7, 8])  # swap "dog" and "man"
    layer = TinySelfAttention(scheme, 9)
    assert (layer(x[perm]) - layer(x)[perm]).abs().max() > 1e-3


@given(st.integers(0, 5000), st.integers(-200, 200), st.sampled_from([8, 32, 128]))
def test_sinusoidal_shift_is_a_rotation_independent_of_p(p, delta, d_model):
    p = max(p, -delta)
    enc = posenc.SinusoidalEncoding(d_model)
    table = enc.table(p + abs(delta) + 1).double().numpy()
    shift = R.sinusoidal_shift_matrix(delta, d_model)
    np.testing.assert_allclose(table[p + delta], shift @ table[p], atol=1e-5)
    for k in range(d_model // 2):  # each 2x2 block is a rotation: orthogonal, determinant 1
        block = shift[2 * k : 2 * k + 2, 2 * k : 2 * k + 2]
        np.testing.assert_allclose(block @ block.T, np.eye(2), atol=1e-12)
        assert np.linalg.det(block) == pytest.approx(1.0)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("offset", [0, 1, 5, 37, 500])
def test_rope_scores_depend_only_on_offset(layout, offset):
    rope = posenc.RotaryEmbedding(64, layout=layout)
    g = torch.Generator().manual_seed(offset)
    q, k = (
        torch.randn(1, 1, 1, 64, generator=g, dtype=torch.float64),
        torch.randn(1, 1, 1, 64, generator=g, dtype=torch.float64),
    )
    scores = []
    for m in [0, 3, 10, 50, 1000, 123_456]:
        qm = rope.rotate(q, positions=torch.tensor([m]))
        kn = rope.rotate(k, positions=torch.tensor([m + offset]))
        scores.append(float((qm * kn).sum()))
    np.testing.assert_allclose(scores, scores[0], rtol=1e-9, atol=1e-9)


def test_rope_scores_change_with_offset():
    rope = posenc.RotaryEmbedding(64)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)
    scores = {float((rope.rotate(q, offset=0) * rope.rotate(k, offset=n)).sum()) for n in range(1, 8)}
    assert len(scores) == 7


def test_rope_keeps_parameter_count_and_vector_norms():
    rope = posenc.RotaryEmbedding(32)
    x = torch.randn(3, 4, 20, 32, dtype=torch.float64)
    torch.testing.assert_close(rope.rotate(x).norm(dim=-1), x.norm(dim=-1))
    assert sum(p.numel() for p in rope.parameters()) == 0


def test_alibi_bias_same_at_any_absolute_position():
    alibi = posenc.ALiBi(4)
    bias = alibi.bias(4096, causal=True)
    torch.testing.assert_close(bias[:, 3000, 2995], bias[:, 8, 3])  # offset 5, positions 3000 and 8
    torch.testing.assert_close(bias[:, 8, 3], -5 * alibi.slopes)


def test_learned_fails_past_its_table_where_sinusoidal_does_not():
    x = torch.zeros(1, 1, 32)
    with pytest.raises(IndexError):
        posenc.LearnedEmbedding(32, 32)(x, offset=64)
    value = posenc.SinusoidalEncoding(32)(x, offset=64)[0, 0, :5]
    np.testing.assert_allclose(value.numpy(), R.sinusoidal(65, 32)[64, :5], atol=1e-6)
