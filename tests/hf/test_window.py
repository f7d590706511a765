"""Sliding-window layers on posenc's windowed kernel (posenc.hf.window): the model's own sliding attention,
prefill and decoding, without the (L, L) mask; what the kernel cannot stand for stays transformers'."""

import pytest
import torch
import transformers

from posenc.hf import patch_model, unpatch_model
from posenc.hf import window as window_module

from .families import build, max_diff


def _sdpa_gemma(seed: int = 0):
    model, config = build("gemma3", seed)
    model.config._attn_implementation = "sdpa"  # transformers' default: the path the kernel replaces
    return model, config


def _spy(monkeypatch) -> list:
    """Count the attention calls that ran on posenc's kernel."""
    calls, real = [], window_module.remap_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape[-2], k.shape[-2], kwargs.get("window")))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(window_module, "remap_attention", spy)
    return calls


def test_the_kernel_gives_the_models_sliding_attention_in_prefill(monkeypatch):
    model, _ = _sdpa_gemma()
    ids = torch.randint(0, 100, (1, 40))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        calls = _spy(monkeypatch)
        patch_model(model)
        got = model(input_ids=ids).logits
    assert model.config._attn_implementation == window_module.IMPLEMENTATION
    assert calls == [(40, 40, 8), (40, 40, 8)]  # the two sliding layers, on the kernel, window 8
    assert max_diff(got, expected) < 1e-5
    unpatch_model(model)
    assert model.config._attn_implementation == "sdpa"


def test_decoding_with_the_cache_equals_the_models_own(monkeypatch):
    model, _ = _sdpa_gemma(1)
    ids = torch.randint(0, 100, (1, 30))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=12, do_sample=False)
        calls = _spy(monkeypatch)
        patch_model(model)
        got = model.generate(ids, max_new_tokens=12, do_sample=False)
    unpatch_model(model)
    assert torch.equal(got, expected)
    assert any(q == 1 for q, _, _ in calls)  # decode steps ran on the kernel too


def test_what_the_kernel_cannot_stand_for_is_transformers_own_attention(monkeypatch):
    model, _ = _sdpa_gemma(2)
    short = torch.randint(0, 100, (1, 6))  # keys fewer than the window: transformers' own mask and SDPA
    padded = torch.randint(0, 100, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :3] = 0  # left padding: a mask the kernel does not take
    with torch.no_grad():
        expected = (model(input_ids=short).logits, model(input_ids=padded, attention_mask=mask).logits)
        calls = _spy(monkeypatch)
        patch_model(model)
        got = (model(input_ids=short).logits, model(input_ids=padded, attention_mask=mask).logits)
    unpatch_model(model)
    assert calls == []
    assert max_diff(got[0], expected[0]) < 1e-5
    assert max_diff(got[1][1, 3:], expected[1][1, 3:]) < 1e-5


def test_models_not_on_sdpa_and_models_without_sliding_layers_are_left_alone():
    eager, _ = build("gemma3")  # eager attention returns its weights: not changed
    patch_model(eager)
    assert eager.config._attn_implementation == "eager"
    unpatch_model(eager)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    llama = transformers.LlamaForCausalLM(config).eval()
    patch_model(llama)
    assert llama.config._attn_implementation == "sdpa"
    unpatch_model(llama)


@pytest.mark.parametrize("q_len, k_len, window", [(40, 40, 8), (1, 8, 8), (5, 12, 4)])
def test_the_fallback_mask_is_transformers_sliding_window(q_len, k_len, window):
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    ours = window_module._sliding_mask(q_len, k_len, window, "cpu")
    theirs = sdpa_mask(
        1,
        q_len,
        k_len,
        q_offset=k_len - q_len,
        mask_function=sliding_window_causal_mask_function(window),
        allow_is_causal_skip=False,
    )
    assert torch.equal(ours, theirs)
