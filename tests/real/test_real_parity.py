"""posenc computing the positions of a real pretrained model (SmolLM2-135M) gives transformers' outputs: as
trained, and with every context-extension method against transformers' own implementation of it."""

import copy

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from posenc.hf import patch_model, rope_settings, unpatch_model
from posenc.real.methods import applied, method_rotary

# Logits are ~10-30 in size; float32 rounding of transformers' angles (formed in float32, posenc's in
# float64) moves them by ~1e-5 at these positions. A wrong rotation moves them by whole units.
LOGITS_TOL = 2e-4
WRONG = 100 * LOGITS_TOL


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


@torch.inference_mode()
def logits(model, ids):
    return model(input_ids=ids).logits


@torch.inference_mode()
def greedy(model, ids, steps=16):
    mask = torch.ones_like(ids)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=2)
    return out[0, ids.shape[1] :].tolist()


def test_patch_model_on_real_weights_is_transformers_with_posenc_computing_every_position(
    fresh_smollm2, real_text
):
    model = fresh_smollm2.model
    ids = real_text[:, :128]
    want, want_tokens = logits(model, ids), greedy(model, ids[:, :48])
    patch_model(model)
    rotary = model.model.rotary_emb
    with torch.no_grad():  # transformers' own cos/sin are now wrong: only posenc's can give the right outputs
        rotary.inv_freq.mul_(1.25)
        rotary.original_inv_freq.mul_(1.25)
    assert max_diff(logits(model, ids), want) < LOGITS_TOL
    assert greedy(model, ids[:, :48]) == want_tokens  # 16 decode steps through transformers' KV cache
    unpatch_model(model)
    assert max_diff(logits(model, ids), want) > WRONG  # the wrong cos/sin show once posenc is gone


def test_a_model_whose_own_positions_posenc_cannot_reproduce_is_refused(fresh_smollm2, real_text):
    """patch_model compares posenc's cos/sin with the model's own before patching: exact or refused."""
    model = fresh_smollm2.model
    with torch.no_grad():
        model.model.rotary_emb.inv_freq.mul_(1.25)  # the model now computes positions its config does not say
    with pytest.raises(ValueError, match="are not what the model computes itself"):
        patch_model(model)
    assert not hasattr(model.model.rotary_emb, "posenc_rotary")


def _native_rotary(config, rotary, method: str, train_len: int, factor: float) -> LlamaRotaryEmbedding:
    """transformers' rotary module for what ``method_rotary`` built: its own code computes the schedule.
    Static NTK, which transformers lacks, is its default schedule at the raised base."""
    config = copy.deepcopy(config)
    base, dim = rope_settings(config)["base"], rotary.rotary_dim
    if method == "ntk":
        config.rope_parameters = {"rope_type": "default", "rope_theta": base * factor ** (dim / (dim - 2))}
    else:
        config.rope_parameters = {"rope_theta": base, **rotary.scaling}
        config.max_position_embeddings = train_len if method == "dynamic" else int(train_len * factor)
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("method", ["pi", "ntk", "dynamic", "yarn", "llama3"])
def test_each_extension_method_reaches_the_real_model_as_transformers_computes_it(
    fresh_smollm2, real_text, method
):
    """Pretending the model was trained at 48 tokens, every method at factor 4 changes the outputs over 160
    tokens, and the change is exactly the one transformers' own RoPE code makes."""
    model, train_len, factor = fresh_smollm2.model, 48, 4.0
    ids = real_text[:, :160]
    with applied(model, method_rotary(model.config, "none", factor=factor)):
        as_trained = logits(model, ids)
    rotary = method_rotary(model.config, method, factor=factor, train_len=train_len)
    with applied(model, rotary):
        got = logits(model, ids)
    own = model.model.rotary_emb
    model.model.rotary_emb = _native_rotary(model.config, rotary, method, train_len, factor).to(ids.device)
    try:
        want = logits(model, ids)
    finally:
        model.model.rotary_emb = own
    assert max_diff(got, want) < LOGITS_TOL
    assert max_diff(got, as_trained) > WRONG
