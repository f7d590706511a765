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


def _rotate(rope, **kwargs):
    return rope.rotate(torch.randn(1, 3, rope.head_dim), **kwargs)


DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "factor": 2.0}


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: posenc.RotaryEmbedding(2, scaling={"rope_type": "ntk", "factor": 2.0}),
            r"'ntk' needs a rotary",
        ),
        (
            lambda: posenc.RotaryEmbedding(2, scaling=DYNAMIC, max_position_embeddings=8),
            r"'dynamic' needs a rot",
        ),
        (
            lambda: posenc.RotaryEmbedding(2, scaling={**LONGROPE, "original_max_position_embeddings": 1}),
            r"original_max_position_embeddings'\] must be >= 2",
        ),
        (
            lambda: posenc.RotaryEmbedding(64, max_position_embeddings="x"),
            r"max_position_embeddings must be an int",
        ),
        (
            lambda: posenc.RotaryEmbedding(64, max_position_embeddings=-5),
            r"max_position_embeddings must be >= 1",
        ),
        (
            lambda: posenc.RotaryEmbedding(8, scaling={"rope_type": "linear", "type": "yarn", "factor": 2.0}),
            r"both rope_type='linear' and type='yarn'",
        ),
        (
            lambda: _rotate(
                posenc.RotaryEmbedding(8, scaling=DYNAMIC, max_position_embeddings=8), context_len=0
            ),
            r"context_len must be >= 1, got 0",
        ),
        (lambda: _rotate(posenc.RotaryEmbedding(8), context_len=-3), r"context_len must be >= 1, got -3"),
        (lambda: posenc.SinusoidalEncoding(8).table(-1), r"length must be an integer >= 0, got -1"),
        (
            lambda: posenc.rerotate_keys(torch.randn(1, 3, 8), 3, "x"),
            r"rotary must be a posenc.RotaryEmbedding",
        ),
        (lambda: posenc.RotaryKVCache(None), r"rotary must be a posenc.RotaryEmbedding, got NoneType"),
        (
            lambda: posenc.ALiBi(4, slopes="abcd"),
            r"slopes must be a sequence or tensor of 4 positive numbers",
        ),
        (
            lambda: posenc.RotaryEmbedding(8)(torch.randn(2, 2, 3, 8), torch.randn(3, 2, 3, 8)),
            r"q and k must share their batch dimensions",
        ),
        (
            lambda: posenc.RotaryEmbedding(8)(*(2 * [torch.randn(1, 2, 3, 8)]), inplace=True),
            r"same tensor would rotate it twice",
        ),
        (
            lambda: _rotate(posenc.RotaryEmbedding(8), positions=torch.arange(3, dtype=torch.uint8)),
            r"positions must have an integer or floating dtype, got torch.uint8",
        ),
        (
            lambda: posenc.attention(*(3 * [torch.randn(1, 2, 3, 8)]), rotary="rope"),
            r"rotary must be a posenc",
        ),
        (lambda: posenc.attention(*(3 * [torch.randn(1, 2, 3, 8)]), rotary=posenc.ALiBi(2)), r"got ALiBi"),
        (
            lambda: posenc.attention(
                torch.randn(1, 2, 3, 8), torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 8)
            ),
            r"q and k must have the same batch size and head_dim",
        ),
        (
            lambda: posenc.attention(
                torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
            ),
            r"q and k must have the same batch size and head_dim",
        ),
    ],
)
def test_issue_inputs_get_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_batch_change_inside_the_kv_cache_is_named():
    cache = posenc.RotaryKVCache(posenc.RotaryEmbedding(8))
    cache.update(*(3 * [torch.randn(2, 2, 3, 8)]))
    with pytest.raises(ValueError, match=r"cached \(batch, kv_heads\) = \(2, 2\).*reset\(\)"):
        cache.update(*(3 * [torch.randn(1, 2, 1, 8)]))


def test_numpy_scalars_are_numbers():
    import numpy as np

    rope = posenc.RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": np.float32(2.0)})
    plain = posenc.RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0})
    x = torch.randn(1, 3, 8)
    torch.testing.assert_close(rope.rotate(x), plain.rotate(x))
    torch.testing.assert_close(posenc.rerotate_keys(x, np.int64(3), plain), posenc.rerotate_keys(x, 3, plain))


def test_changing_the_scaling_dict_after_construction_changes_nothing():
    scaling = {"rope_type": "linear", "factor": 2.0}
    rope = posenc.RotaryEmbedding(8, scaling=scaling)
    scaling["factor"] = 8.0
    rope.scaling["factor"] = 8.0
    assert rope.scaling == {"rope_type": "linear", "factor": 2.0} and "'factor': 2.0" in repr(rope)
    torch.testing.assert_close(
        rope.inv_freq, posenc.rope_frequencies(8, scaling={"rope_type": "linear", "factor": 2.0})[0]
    )


def test_yarn_with_a_base_of_one_is_named():
    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "rope_theta": 1.0}
    with pytest.raises(ValueError, match=r"'yarn' needs a base \(rope_theta\) > 1"):
        posenc.RotaryEmbedding(8, scaling=scaling)
