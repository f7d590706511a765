"""patch_model(model, remap=R) on tiny random Llamas: each attention layer is posenc.attention with the
remap, prefill and cached decoding agree, a remap that changes nothing changes nothing."""

import pytest
import torch
import transformers

import posenc
from posenc.hf import patch_model, rotary_from_config, unpatch_model

REMAPS = [posenc.SelfExtend(2, 6), posenc.ReRoPE(5, leaky=3.0), posenc.STRING(8, 3)]


def _tiny(config_class, model_class, layers: int = 2, **extra):
    """A tiny random model with sharper attention than the 0.02 init, so that positions show."""
    torch.manual_seed(0)
    config = config_class(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        **extra,
    )
    model = model_class(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)
    return model


def tiny_llama(layers=2):
    return _tiny(transformers.LlamaConfig, transformers.LlamaForCausalLM, layers)


def decoded(model, ids, prompt: int) -> torch.Tensor:
    """Logits of a cached prefill of ``prompt`` tokens, then one token at a time."""
    out = model(ids[:, :prompt], use_cache=True)
    steps = [out.logits]
    for t in range(prompt, ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=out.past_key_values, use_cache=True)
        steps.append(out.logits)
    return torch.cat(steps, 1)


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
    torch.testing.assert_close(decoded(model, ids, 25), full, rtol=1e-10, atol=1e-10)
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


def tiny_mistral_with_a_window():
    return _tiny(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=8)


def tiny_gpt_oss():
    """Attention sinks (s_aux) and sliding-window layers alternating with full ones; cos/sin handed out
    narrow, each frequency once."""
    return _tiny(
        transformers.GptOssConfig,
        transformers.GptOssForCausalLM,
        head_dim=16,
        sliding_window=8,
        num_local_experts=4,
        num_experts_per_tok=2,
    )


@torch.no_grad()
@pytest.mark.parametrize("build", [tiny_mistral_with_a_window, tiny_gpt_oss], ids=lambda f: f.__name__)
def test_sliding_windows_and_sinks_are_the_models_own(build):
    """A remap that moves no distance (SelfExtend with groups of 1) leaves the model as it was, sliding
    windows and sinks included; before, the windows were dropped (logits off by 12 on the Mistral)."""
    model = build()
    ids = torch.randint(1, 128, (2, 30))
    want = model(ids).logits
    patch_model(model, remap=posenc.SelfExtend(1, 64))
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-4)
    unpatch_model(model)


@torch.no_grad()
def test_gpt_oss_with_a_remap_decodes_like_its_full_pass_and_like_posenc_attention():
    model = tiny_gpt_oss()  # float32: its experts' grouped matmul takes no float64
    remap = posenc.SelfExtend(2, 5)  # absolute groups: the sliding-window cache's tail must sit right
    attn = model.model.layers[1].self_attn  # a full-attention layer, with sinks
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(h=kw["hidden_states"]), with_kwargs=True)
    attn.register_forward_hook(lambda m, a, kw, out: seen.update(out=out[0]), with_kwargs=True)
    patch_model(model, remap=remap)
    ids = torch.randint(1, 128, (1, 30))
    full = model(ids).logits
    h = seen["h"]
    q = attn.q_proj(h).view(1, 30, 4, 16).transpose(1, 2)
    k = attn.k_proj(h).view(1, 30, 2, 16).transpose(1, 2)
    v = attn.v_proj(h).view(1, 30, 2, 16).transpose(1, 2)
    rotary = rotary_from_config(model.config)
    want = posenc.attention(q, k, v, rotary=rotary, remap=remap, scale=attn.scaling, sinks=attn.sinks)
    torch.testing.assert_close(seen["out"], attn.o_proj(want.transpose(1, 2).reshape(1, 30, 64)))
    torch.testing.assert_close(decoded(model, ids, 20), full, rtol=1e-4, atol=1e-4)


def test_what_the_remap_kernels_cannot_do_is_refused():
    gemma2 = _tiny(transformers.Gemma2Config, transformers.Gemma2ForCausalLM, head_dim=16)
    with pytest.raises(ValueError, match="remap= has no logit soft-capping; gemma2 caps its scores"):
        patch_model(gemma2, remap=posenc.ReRoPE(4))
    model = _tiny(transformers.LlamaConfig, transformers.LlamaForCausalLM, attention_dropout=0.1)
    patch_model(model, remap=posenc.ReRoPE(4))
    model.train()
    with pytest.raises(ValueError, match="remap= has no attention dropout; this layer passes dropout=0.1"):
        model(torch.randint(1, 128, (1, 10)))
    unpatch_model(model)


@torch.no_grad()
def test_a_forward_that_bypasses_the_patched_attention_is_refused_not_run_unrotated():
    model = tiny_llama()
    patch_model(model, remap=posenc.ReRoPE(4))
    model.config._attn_implementation = "sdpa"  # as a family whose attention ignores the interface
    with pytest.raises(ValueError, match="did not go through transformers' attention interface"):
        model(torch.randint(1, 128, (1, 10)))
    model.config._attn_implementation = "posenc_remap"
    unpatch_model(model)


@torch.no_grad()
def test_position_ids_place_the_keys_and_packed_ones_are_refused():
    model = tiny_llama(layers=1)
    attn = model.model.layers[0].self_attn
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(h=kw["hidden_states"]), with_kwargs=True)
    attn.register_forward_hook(lambda m, a, kw, out: seen.update(out=out[0]), with_kwargs=True)
    remap = posenc.SelfExtend(2, 3)  # its groups count absolute positions: an offset shows
    patch_model(model, remap=remap)
    ids = torch.randint(1, 128, (1, 12))
    model(ids, position_ids=torch.arange(5, 17)[None])
    h = seen["h"]
    q = attn.q_proj(h).view(1, 12, 4, 16).transpose(1, 2)
    k = attn.k_proj(h).view(1, 12, 2, 16).transpose(1, 2)
    v = attn.v_proj(h).view(1, 12, 2, 16).transpose(1, 2)
    want = posenc.attention(
        q, k, v, rotary=rotary_from_config(model.config), remap=remap, scale=attn.scaling, offset=5
    )
    torch.testing.assert_close(seen["out"], attn.o_proj(want.transpose(1, 2).reshape(1, 12, 64)))
    packed = torch.cat([torch.arange(6), torch.arange(6)])[None]
    with pytest.raises(ValueError, match="takes consecutive position_ids, one offset for the whole batch"):
        model(ids, position_ids=packed)
    unpatch_model(model)


@torch.no_grad()
def test_the_inner_model_called_directly_places_its_keys_afresh():
    """Without the outer model's hooks, each forward still reads its own position ids."""
    model = tiny_llama(layers=1)
    patch_model(model, remap=posenc.SelfExtend(2, 3))
    ids = torch.randint(1, 128, (1, 12))
    first = model.model(ids, position_ids=torch.arange(5, 17)[None]).last_hidden_state
    plain = model.model(ids).last_hidden_state  # positions 0..11: an offset of 5 would show
    want = model(ids).logits
    torch.testing.assert_close(model.lm_head(plain), want)
    assert (first - plain).abs().max() > 1e-3
    unpatch_model(model)


def test_a_family_whose_cache_positions_the_remap_cannot_follow_is_refused_before_patching():
    """Bamba (Mamba layers with attention on layers 1 and 4), called without position ids, numbers every
    call's tokens from 0, cache or not, so its decoding steps hand the rotary module position 0; the remap
    needs the keys' true positions. The replica check decodes two tokens from a cache and refuses, leaving
    the model as it was."""
    from posenc.tools import zoo

    model = zoo._model_class("bamba")(zoo.tiny_config("bamba")).eval()
    with pytest.raises(ValueError, match="cannot decode bamba from its cache"):
        patch_model(model, remap=posenc.SelfExtend(1, 1 << 20))
    assert not any(hasattr(m, "posenc_rotary") for m in model.modules())


@torch.no_grad()
def test_a_padding_mask_is_refused_however_it_reaches_the_model():
    """The mask given positionally, to the inner model, or as a 4D mask went unread and the padded tokens
    were attended (the output equal to no mask at all); each form is refused, and a mask that pads nothing
    (2D ones, or the causal 4D mask) gives the unpatched model's logits."""
    model = tiny_llama()
    ids = torch.randint(1, 128, (2, 10))
    want = model(ids).logits
    patch_model(model, remap=posenc.SelfExtend(4, 64))  # every distance inside the window: moves none
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    causal = torch.ones(10, 10, dtype=torch.bool).tril()[None, None].expand(2, 1, 10, 10)
    padded = causal.clone()
    padded[1, ..., :3] = False
    for call in (
        lambda: model(ids, mask),
        lambda: model.model(ids, attention_mask=mask),
        lambda: model.model(ids, mask),
        lambda: model(ids, attention_mask=padded),
    ):
        with pytest.raises(ValueError, match="unpadded"):
            call()
    additive = torch.zeros(2, 1, 10, 10).masked_fill(~causal, torch.finfo(torch.float32).min)
    for unpadded in (torch.ones_like(ids), causal, additive):
        torch.testing.assert_close(model(ids, unpadded).logits, want, rtol=1e-5, atol=1e-5)
    hidden = model.model(ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(model.lm_head(hidden), want, rtol=1e-5, atol=1e-5)
