"""patch_model(model, remap=R) on tiny random Llamas: each attention layer is posenc.attention with the
remap, prefill and cached decoding agree, a remap that changes nothing changes nothing."""

import pytest
import torch
import transformers

import posenc
from posenc.hf import patch_model, rotary_from_config, unpatch_model

REMAPS = [posenc.SelfExtend(2, 6), posenc.ReRoPE(5, leaky=3.0), posenc.STRING(8, 3)]


def tiny_llama(layers=2):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper attention than the 0.02 init, so that positions show in the outputs
        for p in model.parameters():
            p.mul_(4)
    return model


@torch.no_grad()
@pytest.mark.parametrize("remap", REMAPS, ids=repr)
def test_each_attention_layer_is_posenc_attention_with_the_remap(remap):
    model = tiny_llama(layers=1)
    attn = model.model.layers[0].self_attn
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(h=kw["hidden_states"]), with_kwargs=True)
    attn.register_forward_hook(lambda m, a, kw, out: seen.update(out=out[0]), with_kwargs=True)
    patch_model(model, remap=remap)
    model(torch.randint(1, 128, (2, 30)))
    h = seen["h"]
    b, n, _ = h.shape
    q = attn.q_proj(h).view(b, n, 4, 16).transpose(1, 2)
    k = attn.k_proj(h).view(b, n, 2, 16).transpose(1, 2)
    v = attn.v_proj(h).view(b, n, 2, 16).transpose(1, 2)
    rotary = rotary_from_config(model.config)
    want = posenc.attention(q, k, v, rotary=rotary, remap=remap, scale=attn.scaling)
    want = attn.o_proj(want.transpose(1, 2).reshape(b, n, 64))
    torch.testing.assert_close(seen["out"], want, rtol=1e-6, atol=1e-6)


@torch.no_grad()
@pytest.mark.parametrize("remap", REMAPS, ids=repr)
def test_cached_decoding_is_the_full_forward_pass(remap):
    model = tiny_llama().double()  # float64: the two orders of summation agree to rounding
    patch_model(model, remap=remap)
    ids = torch.randint(1, 128, (1, 40))
    full = model(ids).logits
    out = model(ids[:, :25], use_cache=True)
    steps = [out.logits]
    for t in range(25, 40):
        out = model(ids[:, t : t + 1], cache=out.past_key_values, use_cache=True)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    assert model(ids, attention_mask=torch.ones_like(ids)).logits.shape == full.shape


@torch.no_grad()
def test_a_remap_that_moves_no_distance_is_the_model_itself_and_unpatching_restores_it():
    model = tiny_llama()
    ids = torch.randint(1, 128, (2, 40))
    want = model(ids).logits
    patch_model(model, remap=posenc.SelfExtend(4, 40))  # every distance inside the window
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-4)
    unpatch_model(model)
    patch_model(model, remap=posenc.SelfExtend(2, 6))
    assert (model(ids).logits - want).abs().max() > 0.1  # a remap that moves distances shows
    unpatch_model(model)
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(model(ids).logits, want)


def test_what_patch_model_with_a_remap_refuses():
    model = tiny_llama()
    patch_model(model, remap=posenc.ReRoPE(4))
    ids = torch.randint(1, 128, (2, 10))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="unpadded batches only"):
        model(ids, attention_mask=mask)
    unpatch_model(model)
    with pytest.raises(ValueError, match="remap must be a posenc.remap.Remap"):
        patch_model(model, remap="rerope")
    gemma = transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    with pytest.raises(ValueError, match="remap= works on single-RoPE models; gemma3_text has a per-layer"):
        patch_model(gemma, remap=posenc.ReRoPE(4))
