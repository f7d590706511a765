"""Tiny randomly initialised transformers models, one per family with a per-layer position plan, and the
helpers the parity tests share. Built from configs typed here: nothing is downloaded."""

from __future__ import annotations

import torch
import transformers

TOL = 1e-5  # float32 rounding of logits of order 1
COMMON = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "max_position_embeddings": 256,
}
SECTION = [4, 2, 2]  # head_dim 16: 8 frequency pairs over time, height, width (interleavable)

FAMILIES = {
    # name: (config class, model class, config kwargs)
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            COMMON,
            sliding_window=8,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
        ),
    ),
    "llama4": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        dict(
            COMMON,
            intermediate_size_mlp=128,
            num_local_experts=2,
            attention_chunk_size=8,
            no_rope_layers=[1, 1, 1, 0],
            attn_temperature_tuning=True,
            floor_scale=4,
            attn_scale=0.5,
            use_qk_norm=True,
            rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        ),
    ),
    "gemma4": (
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        dict(
            COMMON,
            global_head_dim=32,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=128,
            num_kv_shared_layers=2,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {
                    "rope_type": "proportional",
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1e6,
                },
            },
        ),
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(COMMON, no_rope_layers=[1, 1, 1, 0])),
    "cohere2": (
        "Cohere2Config",
        "Cohere2ForCausalLM",
        dict(COMMON, sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            COMMON,
            num_key_value_heads=4,
            head_dim=8,  # DeepSeek's config: head_dim is the rotary slice
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "rope_theta": 10000.0,
            },
        ),
    ),
    "qwen2_vl": (
        "Qwen2VLTextConfig",
        "Qwen2VLTextModel",
        dict(COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": SECTION}),
    ),
    "qwen2_5_vl": (
        "Qwen2_5_VLTextConfig",
        "Qwen2_5_VLTextModel",
        dict(COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": SECTION}),
    ),
    "qwen3_vl": (
        "Qwen3VLTextConfig",
        "Qwen3VLTextModel",
        dict(
            COMMON,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "mrope_section": SECTION,
                "mrope_interleaved": True,
            },
        ),
    ),
}


def build(name: str, seed: int = 0):
    """(model, config) of a family, float32, eager attention, weights scaled up so that positions matter."""
    cfg_cls, model_cls, kwargs = FAMILIES[name]
    config = getattr(transformers, cfg_cls)(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # sharper attention than the 0.02 init, so a wrong position shows in the logits
        for name_, p in model.named_parameters():
            if any(k in name_ for k in ("q_proj", "k_proj", "q_b_proj", "kv_a_proj", "q_a_proj")):
                p.mul_(8.0)
    return model, config


def output(model, **kwargs) -> torch.Tensor:
    out = model(**kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def decode(model, ids, split: int, position_ids=None, **kwargs) -> list[torch.Tensor]:
    """Outputs of a prefill of ids[:, :split] and then one token at a time with the model's cache.

    position_ids: (3, batch, seq) for M-RoPE, sliced step by step like ids."""

    def pos(a, b):
        return None if position_ids is None else position_ids[..., a:b]

    out = model(input_ids=ids[:, :split], position_ids=pos(0, split), use_cache=True, **kwargs)
    steps, cache = [_last(out)], out.cache
    for t in range(split, ids.shape[1]):
        out = model(input_ids=ids[:, t : t + 1], position_ids=pos(t, t + 1), cache=cache, use_cache=True)
        steps.append(_last(out))
        cache = out.cache
    return steps


def _last(out) -> torch.Tensor:
    x = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return x[:, -1]


def max_diff(a, b) -> float:
    if isinstance(a, list):
        return max(max_diff(x, y) for x, y in zip(a, b, strict=True))
    return float((a - b).abs().max())
