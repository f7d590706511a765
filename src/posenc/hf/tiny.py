"""Tiny models of a transformers family: a config's sizes made small, everything else kept, so that a model
built from it runs the family's own code in milliseconds (the zoo sweep, patch_model(remap=)'s replica
check)."""

from __future__ import annotations

__all__ = ["MAX_PARAMETERS", "shrunk"]

MAX_PARAMETERS = 40_000_000  # a tiny config that is still larger than this kept a size its shrinking missed

# Every size key a config may carry, made small; a config's other keys keep their defaults.
_SIZES = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=6,  # Gemma-style patterns (five local, one global) reach a global layer
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,  # the width the default mrope_section lists are laid out for
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    num_experts=4,
    n_routed_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    vocab_size=512,
    n_layer=6,
    n_head=2,
    n_embd=256,
    num_layers=6,
    d_model=256,
    depth=2,
    embed_dim=128,
    num_heads=2,
    out_hidden_size=256,
    vision_hidden_size=256,
    vocab_size_per_layer_input=512,  # Gemma 4's per-layer embeddings
    hidden_size_per_layer_input=16,
    index_n_heads=2,  # DeepSeek-V3.2's sparse-attention indexer
    index_num_heads=2,  # Kolibri's, at most the attention heads kept
    ffn_hidden_size=512,
    expert_ffn_hidden_size=64,
    ffn_dim=512,
    moe_num_experts=4,
    moe_k=2,  # ERNIE 4.5's experts per token, at most the experts kept
    zero_expert_num=2,  # LongCat-Flash's identity experts
    moe_topk=2,
    linear_num_heads=2,  # linear-attention layers of hybrids
    unpadded_vocab_size=512,
    audio_vocab_size=64,
    encoder_hash_byte_group_vocab=512,  # BLT's hashed n-gram embeddings, one table per n
    hidden_size_global=256,  # BLT's local encoder and decoder read the global model's hidden size
)
_GLM_MROPE = {  # GLM-4.1V's released rope_parameters: its code splits 64 rotated dimensions in these sections
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [8, 12, 12],
    }
}
# What released checkpoints set and a config class's defaults leave out, where the family's own code cannot
# run without it (by model_type, also inside a composite's text_config)
_RELEASED = {
    "glm4v_text": _GLM_MROPE,
    "glm_image_text": _GLM_MROPE,
    "glm_ocr_text": _GLM_MROPE,
    "diffllama": {"num_key_value_heads": 2},  # its differential attention splits the KV heads in two
    # Qwen3.5 rotates a quarter of a 256-wide head: 32 pairs, as many as its mrope_section lists
    "qwen3_5_text": {"head_dim": 256},
    "qwen3_5_moe_text": {"head_dim": 256},
    "bamba": {"attn_layer_indices": [1, 4]},  # its released models mix attention layers in; the default none
    # HunYuan-VL's XD-RoPE sections (its config class's default has none, which its code cannot run)
    "hunyuan_vl_text": {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16] * 4}
    },
}
_TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _is_config(key: str, value: dict) -> bool:
    """Whether a dict inside a config's to_dict() is a sub-model's config: a ``*_config`` key, or one that
    names its model_type (T5Gemma's ``encoder`` and ``decoder``)."""
    return key != "per_layer_config" and (key.endswith("_config") or isinstance(value.get("model_type"), str))


def shrunk(values: dict) -> dict:
    """The keyword arguments that make a config with these ``values`` (its ``to_dict()``) tiny."""
    out = {}
    layers = values.get("num_hidden_layers")
    mla = "kv_lora_rank" in values  # DeepSeek-style latent attention: head_dim is set from its rope slice
    for key, value in values.items():
        if key in _SIZES and isinstance(value, list) and all(type(v) is int for v in value):
            per_layer = isinstance(layers, int) and layers > 1 and len(value) == layers
            # one size per layer (Gemma 3n), or per modality (ERNIE-4.5-VL's experts)
            out[key] = [_SIZES[key]] * (_SIZES["num_hidden_layers"] if per_layer else len(value))
        elif key in _SIZES and (value is None or isinstance(value, int)) and not isinstance(value, bool):
            if not (mla and key == "head_dim"):
                out[key] = (
                    _SIZES["num_attention_heads"] if mla and key == "num_key_value_heads" else _SIZES[key]
                )
        elif key in _TOKEN_IDS and isinstance(value, int):
            out[key] = _TOKEN_IDS[key]
        elif isinstance(value, dict) and _is_config(key, value):
            out[key] = shrunk(value) | ({"model_type": value["model_type"]} if "model_type" in value else {})
        elif isinstance(layers, int) and layers > 1 and isinstance(value, list) and len(value) == layers:
            out[key] = value[: _SIZES["num_hidden_layers"]]  # one entry per layer
        elif key == "per_layer_config" and isinstance(value, dict):
            out[key] = {i: c for i, c in value.items() if int(i) < _SIZES["num_hidden_layers"]}
    return out | _RELEASED.get(values.get("model_type"), {})
