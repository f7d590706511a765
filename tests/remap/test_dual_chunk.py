"""Dual Chunk Attention (An et al. 2024; vLLM's positions) against posenc.reference: distances, attention,
gradients, decoding, the config reader."""

import numpy as np
import pytest
import torch
from hypothesis import given

import posenc
from posenc import reference as R

from .cases import case, check_against_oracle, check_decoding, check_gradients


def test_distances_are_vllms_positions():
    d = R.dual_chunk_distance(14, 14, chunk_size=6, local_size=2)  # chunks of 4
    assert d[5, 2] == min(5 % 4 + 4, 6) - 2  # successive chunk: the true distance, 3
    assert d[6, 1] == min(6 % 4 + 4, 6) - 1  # successive chunk, capped at chunk_size
    assert d[13, 0] == min(2 * 4 - 1, 6) - 0  # inter-chunk: the constant query position
    assert d[7, 5] == 2 and np.isnan(d[3, 9])  # intra-chunk: the true distance
    assert np.nanmax(d) <= 6


@given(case())
def test_attention_is_the_oracles_in_float64(c):
    remap = posenc.DualChunk(chunk_size=7, local_size=2)
    check_against_oracle(c, remap, lambda lq, lk, o: R.dual_chunk_distance(lq, lk, 7, 2, o))


@given(case())
def test_attention_is_the_oracles_in_float32(c):
    remap = posenc.DualChunk(chunk_size=5, local_size=1)
    check_against_oracle(
        c, remap, lambda lq, lk, o: R.dual_chunk_distance(lq, lk, 5, 1, o), torch.float32, 1e-5
    )


def test_gradients():
    check_gradients(posenc.DualChunk(chunk_size=5, local_size=2))


def test_decoding_with_unrotated_keys_is_the_full_pass():
    check_decoding(posenc.DualChunk(chunk_size=8, local_size=3))


def test_read_from_a_config_and_bad_parameters_refused_by_name():
    config = {
        "dual_chunk_attention_config": {
            "chunk_size": 262144,
            "local_size": 8192,
            "original_max_position_embeddings": 262144,
        }
    }
    remap = posenc.DualChunk.from_config(config)
    assert (remap.chunk_size, remap.local_size, remap.chunk_len) == (262144, 8192, 253952)
    with pytest.raises(ValueError, match="config has no dual_chunk_attention_config"):
        posenc.DualChunk.from_config({"model_type": "qwen2"})
    with pytest.raises(ValueError, match="local_size must be < chunk_size"):
        posenc.DualChunk(8, 8)
    rope = posenc.RotaryEmbedding(8, max_position_embeddings=6)
    q = torch.randn(1, 1, 40, 8)
    with pytest.raises(ValueError, match="chunk_size=8 is past the rotary's max_position_embeddings=6"):
        posenc.attention(q, q, q, rotary=rope, remap=posenc.DualChunk(8, 2))
    posenc.attention(q, q, q, rotary=rope, remap=posenc.DualChunk(6, 2))  # chunks of the trained length
