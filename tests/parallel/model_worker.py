"""A gloo rank of the context-parallel model tests: a tiny transformers model's logits for this rank's shard
of the sequence, against the same model's own forward on the whole sequence; the largest error per model
written to ``out/<rank>.json``."""

from __future__ import annotations

import json
import os

import torch
import transformers

from posenc.hf import context_parallel
from posenc.parallel import shard, shard_indices

from .group import gloo_rank


def _tiny(config_class, model_class, attn_implementation="sdpa", dtype=torch.float64, **extra):
    torch.manual_seed(0)
    config = config_class(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        attn_implementation=attn_implementation,
        **extra,
    )
    model = model_class(config).eval().to(dtype)
    with torch.no_grad():  # sharper attention than the 0.02 init, so that positions show
        for name, p in model.named_parameters():
            if "proj" in name and p.dim() == 2:
                p.mul_(8)
    return model


MODELS = {
    "llama": lambda: _tiny(transformers.LlamaConfig, transformers.LlamaForCausalLM),
    # sliding (window 5) and full layers: the mask a context-parallel hook must not lose
    "gemma3": lambda: _tiny(
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        head_dim=16,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    ),
    "gpt_oss": lambda: _tiny(
        transformers.GptOssConfig,
        transformers.GptOssForCausalLM,
        head_dim=16,
        sliding_window=5,
        num_local_experts=4,
        num_experts_per_tok=2,
        attn_implementation="eager",
        dtype=torch.float32,  # its experts' grouped matmul takes no float64
    ),
}


def run_models(rank: int, world: int, store: str, out: str, names: list, length: int, layout: str) -> None:
    with gloo_rank(rank, world, store):
        errors = {}
        ids = torch.randint(1, 128, (2, length), generator=torch.Generator().manual_seed(length))
        for name in names:
            model = MODELS[name]()
            with torch.no_grad():
                want = model(ids).logits
                cp = context_parallel(model)
                indices = shard_indices(length, world, rank, layout, pad=True)
                got = cp(shard(ids, indices, 1), indices).logits
                cp.close()
            keep = indices >= 0
            errors[name] = (got[:, keep] - want[:, indices[keep]]).abs().max().item()
            errors[name + " scale"] = want.abs().max().item()
            errors[name + " dtype"] = str(want.dtype)
        with open(os.path.join(out, f"{rank}.json"), "w") as f:
            json.dump(errors, f)
