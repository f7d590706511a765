"""Gemma 3 270M on real weights (posenc.real.shipped, posenc.hf): patch_model reproduces the model, its
global and sliding layers and its sliding windows on posenc's kernel, with transformers' own rotary
sabotaged so that every angle the model uses is posenc's."""

import json.decoder
from pathlib import Path

import pytest
import torch

from posenc.hf import patch_model, position_plan, unpatch_model
from posenc.hf import window as window_module
from posenc.real.loader import load_real_model


@pytest.fixture
def gemma(gemma3_folder):
    """A model of the test's own: the test changes its rotary modules."""
    return load_real_model(gemma3_folder)


def _sabotage(model) -> None:
    """Every transformers rotary module's frequencies scaled by 1.37: wrong angles wherever they are used."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            for name, buffer in module.named_buffers(recurse=False):
                if "inv_freq" in name:
                    buffer.mul_(1.37)


def _final_states(model, ids):
    """The last layer's normed states at every position (B, L, 640): what the logits are a linear function
    of, without the 262,144-word head over every position (most of a forward's time at 1024 tokens)."""
    return model.model(input_ids=ids).last_hidden_state


def test_the_real_model_is_gemma_3_270m_as_its_card_says(gemma):
    config = gemma.model.config
    plan = position_plan(config)
    assert gemma.info["model_type"] == "gemma3_text" and gemma.info["layers"] == 18
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 1, 256)
    assert [lp.layer for lp in plan if lp.attention == "full"] == [5, 11, 17]
    assert {lp.rope.base for lp in plan if lp.attention == "full"} == {1e6}
    assert {(lp.rope.base, lp.window) for lp in plan if lp.attention == "sliding"} == {(1e4, 512)}
    assert config.max_position_embeddings == 32768


def test_patched_prefill_and_greedy_decoding_match_the_model_with_its_rotary_sabotaged(gemma, monkeypatch):
    model, tokenizer = gemma.model, gemma.tokenizer
    text = Path(json.decoder.__file__).read_text() * 4
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :1024]
    with torch.inference_mode():
        expected = _final_states(model, ids)
        greedy = model.generate(ids[:, :900], max_new_tokens=12, do_sample=False)
    _sabotage(model)
    with torch.inference_mode():
        broken = _final_states(model, ids)
    calls = []
    real = window_module.remap_attention
    monkeypatch.setattr(window_module, "remap_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    patch_model(model)
    try:
        with torch.inference_mode():
            got = _final_states(model, ids)
            decoded = model.generate(ids[:, :900], max_new_tokens=12, do_sample=False)
    finally:
        unpatch_model(model)
    scale = expected.abs().max().item()
    assert (broken - expected).abs().max().item() > 0.1 * scale  # the sabotage shows without posenc
    assert (got - expected).abs().max().item() < 2e-5 * scale  # measured 4.3e-4 on a scale of 118
    assert torch.equal(decoded, greedy)
    assert len(calls) >= 15  # the 15 sliding layers of the prefill ran on posenc's windowed kernel
