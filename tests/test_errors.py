"""Bad arguments raise ValueError at once, naming the argument and what is allowed."""

import pytest
import torch

import posenc


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: posenc.RotaryEmbedding(7), r"head_dim must be even.*7"),
        (lambda: posenc.RotaryEmbedding(0), r"head_dim must be an integer >= 2"),
        (lambda: posenc.RotaryEmbedding(8, rotary_dim=3), r"rotary_dim must be even.*3"),
        (lambda: posenc.RotaryEmbedding(8, rotary_dim=16), r"rotary_dim must be <= head_dim=8.*16"),
        (
            lambda: posenc.RotaryEmbedding(8, layout="neox"),
            r"layout must be one of 'interleaved', 'half'; got 'neox'",
        ),
        (lambda: posenc.RotaryEmbedding(8, base=-1.0), r"base must be a finite number > 0"),
        (lambda: posenc.RotaryEmbedding(8.0), r"head_dim must be an integer"),
        (lambda: posenc.ALiBi(0), r"n_heads must be an integer >= 1, got 0"),
        (lambda: posenc.ALiBi(2, slopes=[1.0]), r"slopes must have shape \(2,\)"),
        (lambda: posenc.ALiBi(2, slopes=[1.0, -1.0]), r"slopes must be finite and > 0"),
        (lambda: posenc.alibi_slopes(-3), r"n_heads must be an integer >= 1, got -3"),
        (lambda: posenc.LearnedEmbedding(0, 8), r"max_len must be an integer >= 1, got 0"),
        (lambda: posenc.LearnedEmbedding(8, 0), r"d_model must be an integer >= 1, got 0"),
        (lambda: posenc.SinusoidalEncoding(5), r"d_model must be even"),
        (lambda: posenc.ALiBi(2).bias(4, 2), r"k_len must be >= q_len"),
        (lambda: posenc.ALiBi(2).bias(0), r"q_len must be an integer >= 1"),
    ],
)
def test_constructor_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "positions, match",
    [
        (torch.arange(4), r"positions must have shape \(5,\) or \(batch, 5\).*got \(4,\)"),
        (torch.zeros(2, 2, 5, dtype=torch.long), r"positions must have shape"),
        (
            torch.ones(5, dtype=torch.bool),
            r"positions must have an integer or floating dtype, got torch.bool",
        ),
        (torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0]), r"positions must be finite"),
        (torch.tensor([0, 1, -2, 3, 4]), r"positions must be >= 0"),
        (torch.zeros(3, 5, dtype=torch.long), r"positions has batch size 3, but the input's batch size is 2"),
        ([0, 1, 2, 3, 4], r"positions must be a torch.Tensor"),
    ],
)
def test_bad_positions(positions, match):
    rope = posenc.RotaryEmbedding(8)
    with pytest.raises(ValueError, match=match):
        rope.rotate(torch.randn(2, 1, 5, 8), positions=positions)


def test_bad_tensors():
    rope = posenc.RotaryEmbedding(8)
    with pytest.raises(ValueError, match=r"x must have last dimension head_dim=8, got shape \(1, 5, 6\)"):
        rope.rotate(torch.randn(1, 5, 6))
    with pytest.raises(ValueError, match=r"q must be a floating-point tensor"):
        rope(torch.ones(1, 5, 8, dtype=torch.long), torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match=r"offset must be an integer >= 0, got -1"):
        rope.rotate(torch.randn(1, 5, 8), offset=-1)
    with pytest.raises(ValueError, match=r"x must have last dimension d_model=8"):
        posenc.SinusoidalEncoding(8)(torch.randn(2, 3, 4))


def test_attention_errors():
    q = torch.randn(1, 4, 6, 8)
    with pytest.raises(ValueError, match=r"ALiBi has n_heads=2, but q has 4 heads"):
        posenc.attention(q, q, q, bias=posenc.ALiBi(2))
    with pytest.raises(ValueError, match=r"q's head count 4 must be a multiple of k's 3"):
        posenc.attention(q, torch.randn(1, 3, 6, 8), torch.randn(1, 3, 6, 8))
    with pytest.raises(ValueError, match=r"q must have .*(4|\(batch, heads, seq, dim\))"):
        posenc.attention(q[0], q, q)
    with pytest.raises(ValueError, match=r"bias must be .*got str"):
        posenc.attention(q, q, q, bias="alibi")
