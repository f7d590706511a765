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
            r"positions must have a signed integer or floating dtype, got torch.bool",
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
            r"positions must have a signed integer or floating dtype, got torch.uint8",
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


@pytest.mark.parametrize(
    "cu, match",
    [
        (torch.tensor([0, 5, 3], dtype=torch.uint8), r"cu_seqlens must not decrease, got \[0, 5, 3\]"),
        (torch.tensor([0, 5, 3], dtype=torch.int8), r"cu_seqlens must not decrease"),
        (torch.tensor([0, 2, 5]).to(torch.uint16), r"cu_seqlens must be a 1-D integer tensor.*uint16"),
        (torch.tensor([1, 2, 5], dtype=torch.uint8), r"cu_seqlens must start at 0"),
        (torch.tensor([0.0, 2.0]), r"cu_seqlens must be a 1-D integer tensor.*float32"),
    ],
)
def test_bad_cu_seqlens_are_named_whatever_their_dtype(cu, match):
    """uint8 differences wrap (3 - 5 = 254): lengths are taken in int64, so a decrease is seen."""
    with pytest.raises(ValueError, match=match):
        posenc.packed_positions(cu_seqlens=cu)


def test_small_integer_cu_seqlens_and_document_ids_are_their_positions():
    from posenc import reference as R

    want = R.packed_positions([2, 3])
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        got = posenc.packed_positions(cu_seqlens=torch.tensor([0, 2, 5], dtype=dtype))
        assert got.tolist() == want.tolist()
        ids = torch.tensor([0, 0, 1, 1, 1], dtype=dtype)
        assert posenc.packed_positions(document_ids=ids).tolist() == want.tolist()
    with pytest.raises(ValueError, match="document_ids must be an integer tensor.*uint32"):
        posenc.packed_positions(document_ids=torch.zeros(5, dtype=torch.uint32))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: posenc.SelfExtend(10**30, 4), r"group_size must be an integer in \[1, 2\^53"),
        (lambda: posenc.SelfExtend(2, 2**64), r"window must be an integer in \[1, 2\^53"),
        (lambda: posenc.ReRoPE(10**30), r"window must be an integer in \[1, 2\^53"),
        (lambda: posenc.ReRoPE(4, log_n_length=2**63), r"log_n_length must be an integer in \[2, 2\^53"),
        (lambda: posenc.STRING(2**63, 2), r"shift must be an integer in \[1, 2\^53"),
        (lambda: posenc.STRING(8, 2, attention_factor=1e300), r"attention_factor must be .* in \(0, 100\]"),
        (lambda: posenc.DualChunk(10**30, 0), r"chunk_size must be an integer in \[1, 2\^53"),
        (lambda: posenc.DualChunk(8, 2, 2**64), r"original_max_position_embeddings must be an integer in"),
        (lambda: posenc.FoPE(8, heads=2**40, train_len=16), r"heads must be an integer <= 1048576"),
        (lambda: posenc.FoPE(8, heads=2, train_len=2**63), r"train_len must be an integer in \[1, 2\^53"),
        (lambda: posenc.FoPE(8, 2, 16, learnable=None), r"learnable must be True or False, got None"),
        (lambda: posenc.FoPE(8, 2, 16, generator=0), r"generator must be a torch.Generator or None"),
        (lambda: posenc.AxialRotaryEmbedding(8, mixed=None), r"mixed must be True or False, got None"),
        (lambda: posenc.AxialRotaryEmbedding(8, mixed=True), r"mixed=True .* needs num_heads"),
        (
            lambda: posenc.AxialRotaryEmbedding(8, mixed=True, num_heads=2**40),
            r"num_heads must be an integer <=",
        ),
        (lambda: posenc.AxialRotaryEmbedding(8, seed=2**64), r"seed must be an integer in \[0, 2\^64 - 1\]"),
        (lambda: posenc.AxialRotaryEmbedding(7), r"head_dim must be even"),
        (lambda: posenc.blockwise_causal_mask(2**40, 2**40, 4), r"q_len must be an integer <= 1048576"),
    ],
)
def test_constructor_values_that_cannot_work_are_refused_with_their_range(make, match):
    """Integers past int64, or past what float64 positions hold exactly, and factors whose use overflows:
    refused at construction by name, not at the first call (OverflowError) or by a crash inside torch."""
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "extra, match",
    [
        (dict(offset=2**64), r"offset must be an integer in \[0, 2\^53"),
        (dict(offset=2**63, remap=posenc.ReRoPE(2)), r"offset must be an integer in \[0, 2\^53"),
        (dict(scale=1e300), r"scale must be a finite number in \(0, 10000\]"),
        (dict(causal=None), r"causal must be True or False, got None"),
        (dict(positions=torch.tensor([0, 1, 2, 3, 4, 2**62])), r"positions must be <= 2\^53"),
    ],
)
def test_attention_refuses_values_past_what_positions_and_scores_hold(extra, match):
    q = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match=match):
        posenc.attention(q, q, q, rotary=posenc.RotaryEmbedding(8), **extra)


def test_streaming_cache_past_the_trained_length_names_both_arguments_and_the_limit():
    from posenc.hf import patch_model, streaming_cache, unpatch_model
    from posenc.remap import NoRemap

    from .hf.test_remap_models import tiny_llama

    model = tiny_llama(layers=1)  # max_position_embeddings=64
    patch_model(model, remap=NoRemap())
    match = (
        r"sink_tokens=4 \+ window=61 = 65 kept tokens .* max_position_embeddings=64: sink_tokens \+ window "
        r"must be <= 64"
    )
    with pytest.raises(ValueError, match=match):
        streaming_cache(model, sink_tokens=4, window=61)
    streaming_cache(model, sink_tokens=4, window=60)
    unpatch_model(model)
    patch_model(model, remap=posenc.SelfExtend(2, 8))  # 2 (64 - 8) + 8 = 120 tokens map inside 64
    with pytest.raises(ValueError, match=r"must be <= 120"):
        streaming_cache(model, sink_tokens=4, window=117)
    streaming_cache(model, sink_tokens=4, window=116)
    unpatch_model(model)
