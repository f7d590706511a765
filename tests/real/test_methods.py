"""posenc.real.methods: the trained length a config gives, the RoPE each method builds from it."""

import math

import pytest
import torch

from posenc import SelfExtend
from posenc.extension import METHODS, extension_scaling
from posenc.hf import rope_settings
from posenc.real.methods import (
    EXTEND_METHODS,
    check_extendable,
    method_remap,
    method_rotary,
    trained_length,
)

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "max_position_embeddings": 8192,
    "rope_theta": 1e5,
}


@pytest.mark.parametrize(
    "extra, want",
    [
        ({}, 8192),
        ({"original_max_position_embeddings": 4096}, 4096),  # Phi-3's top-level key
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}},
            2048,
        ),
        ({"rope_parameters": {"rope_type": "llama3", "original_max_position_embeddings": 1024}}, 1024),
    ],
)
def test_the_trained_length_is_the_original_context_when_the_config_names_one(extra, want):
    assert trained_length({**LLAMA, **extra}) == want


def test_a_config_without_a_length_asks_for_train_len():
    with pytest.raises(ValueError, match="give its trained length with --train-len"):
        trained_length({"model_type": "llama", "rope_theta": 1e4})


@pytest.mark.parametrize(
    "method", [m for m in EXTEND_METHODS if m != "none" and METHODS[m].kind == "frequencies"]
)
def test_each_method_is_its_scaling_at_the_factor_counted_from_the_trained_length(method):
    rot = method_rotary(LLAMA, method, factor=3.0, train_len=2048)
    assert rot.scaling == extension_scaling(method, 3.0, 2048)
    assert rot.max_position_embeddings == 2048  # where dynamic NTK starts to scale
    settings = rope_settings(LLAMA)
    assert (rot.head_dim, rot.base, rot.layout) == (settings["head_dim"], 1e5, "half")
    plain = method_rotary(LLAMA, "none", factor=3.0)
    inv, _ = rot.frequencies(3 * 2048)
    assert not torch.equal(inv, plain.frequencies(3 * 2048)[0])


def test_none_is_the_config_as_it_is_whatever_the_factor():
    yarn = {
        **LLAMA,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    }
    assert method_rotary(yarn, "none", factor=8.0).scaling == rope_settings(yarn)["scaling"]
    assert method_rotary(LLAMA, "none", factor=8.0).scaling is None
    with pytest.raises(ValueError, match="method must be one of none, pi, ntk, .*, dca; got 'chunked'"):
        method_rotary(LLAMA, "chunked", factor=2.0)


def test_models_it_cannot_run_are_refused_before_any_work():
    # a per-layer plan (Gemma 3) runs when its config describes one, and is refused by what it lacks
    with pytest.raises(ValueError, match="config has no num_hidden_layers"):
        check_extendable({"model_type": "gemma3_text", "head_dim": 64, "rope_theta": 1e6})
    check_extendable({"model_type": "gemma3_text", "head_dim": 64, "num_hidden_layers": 6, "rope_theta": 1e6})
    with pytest.raises(ValueError, match="describes no rotary embedding"):
        check_extendable({"model_type": "gpt2", "n_embd": 64, "n_head": 4})
    check_extendable(LLAMA)


@pytest.mark.parametrize("longest", [8192, 16384, 32768])
def test_training_free_methods_keep_the_longest_length_inside_the_trained_one(longest):
    n = 8192
    for method in ("selfextend", "rerope", "leaky-rerope"):
        remap = method_remap(method, train_len=n, longest=longest)
        assert remap.distance(longest - 1) <= n - 1
        remap.check_length(longest, n)  # no error
        assert remap.window == n // 4
        assert method_rotary(LLAMA, method, factor=longest / n).scaling is None  # the model's own RoPE
    dca = method_remap("dca", train_len=n, longest=longest)
    assert (dca.chunk_size, dca.local_size) == (n, n // 32)
    dca.check_length(longest, n)
    group = method_remap("selfextend", train_len=n, longest=longest).group_size
    assert group == 1 or SelfExtend(group - 1, n // 4).distance(longest - 1) > n - 1  # the smallest


def test_string_is_the_released_codes_setting_and_cannot_reach_past_the_trained_length():
    remap = method_remap("string", train_len=8192, longest=16384)
    assert (remap.shift, remap.local_window) == (int(0.33 * 8192), 128)
    assert remap.attention_factor == pytest.approx(0.1 * math.log(2) + 1)
    remap.check_length(8192, 8192)
    with pytest.raises(ValueError, match="past the rotary's max_position_embeddings=8192"):
        remap.check_length(16384, 8192)
    assert method_remap("yarn", train_len=8192, longest=16384) is None
