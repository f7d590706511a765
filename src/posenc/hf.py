"""Hugging Face transformers interop (optional dependency: ``pip install posenc[hf]``).

- :func:`rotary_from_config`: a :class:`posenc.RotaryEmbedding` with exactly the RoPE a transformers config
  (object or config.json dict) describes: head_dim, rope_theta, partial rotary, the ``rope_scaling`` /
  ``rope_parameters`` method, and the pairing layout that model family's code uses.
- :func:`patch_model`: run a transformers model with posenc computing its rotary cos/sin (float64
  angles, per-call context for dynamic methods); :func:`unpatch_model` undoes it.
- :func:`consistent_cache`: a transformers ``DynamicCache`` that re-rotates the cached keys whenever a
  length-dependent schedule (dynamic NTK, dynamic YaRN, LongRoPE) changes, so cached keys and the new
  query always share one schedule (see :mod:`posenc.rope.cache`).

transformers itself is only imported by the caller: nothing here needs it at import time.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

from .rope import RotaryEmbedding
from .rope.frequencies import METHODS

__all__ = [
    "INTERLEAVED_MODEL_TYPES",
    "consistent_cache",
    "patch_model",
    "rotary_from_config",
    "unpatch_model",
]

# Families whose transformers code pairs dimensions (2i, 2i+1); every other RoPE family in transformers
# (Llama, Mistral, Qwen2, GPT-NeoX, Phi-3, Gemma, ...) uses rotate_half, pairs (i, i + r/2).
INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "cohere", "cohere2"})

# model types patch_model is tested on (tests/test_hf_parity.py); others with the same rotary module
# layout (attributes inv_freq and attention_scaling, forward(x, position_ids) -> (cos, sin)) also work.
PATCHED_FAMILIES = ("llama", "qwen2", "gpt_neox", "phi3", "gptj")


def _get(config, *names, default=None):
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return default


def _head_dim(config) -> int:
    head_dim = _get(config, "head_dim")
    if head_dim is not None:
        return head_dim
    hidden = _get(config, "hidden_size", "n_embd", "d_model")
    heads = _get(config, "num_attention_heads", "n_head")
    if hidden is None or heads is None:
        raise ValueError("config has neither head_dim nor hidden_size and num_attention_heads")
    return hidden // heads


def rope_settings(config) -> dict:
    """The keyword arguments of :class:`posenc.RotaryEmbedding` a transformers config describes.

    Follows ``RotaryEmbeddingConfigMixin.standardize_rope_params``: ``rope_parameters`` or the older
    ``rope_scaling`` + ``rope_theta``; partial rotary from the dict, ``partial_rotary_factor``, GPT-NeoX's
    ``rotary_pct`` or GPT-J's ``rotary_dim``; a top-level ``original_max_position_embeddings`` (Phi-3)
    takes precedence, else it defaults to max_position_embeddings for llama3 / yarn / longrope.
    """
    if isinstance(config, torch.nn.Module) and hasattr(config, "config"):
        config = config.config
    if not isinstance(config, Mapping) and not hasattr(config, "model_type"):
        raise ValueError(
            "config must be a transformers config, a config.json dict or a model, got "
            f"{type(config).__name__}"
        )
    model_type = _get(config, "model_type", default="")
    head_dim = _head_dim(config)
    max_pos = _get(config, "max_position_embeddings", "n_positions")

    params = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"config's rope_parameters / rope_scaling must be a dict, got {params!r}")
    if params and all(isinstance(v, Mapping) or v is None for v in params.values()):
        raise ValueError(
            f"per-layer-type rope_parameters (keys {sorted(params)}) are not supported: build one "
            "RotaryEmbedding per layer type with posenc.RotaryEmbedding(..., "
            "scaling=config.rope_parameters[type])"
        )
    params = dict(params)
    theta = params.pop("rope_theta", None) or _get(config, "rope_theta", "rotary_emb_base", default=10000.0)
    prf = params.pop("partial_rotary_factor", None) or _get(
        config, "partial_rotary_factor", "rotary_pct", default=1.0
    )
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if model_type == "phi3" and rope_type in ("su", "yarn"):
        rope_type = "longrope"  # Phi3Config renames these, as transformers does
    if rope_type in ("llama3", "yarn", "longrope"):
        top = _get(config, "original_max_position_embeddings")
        if top is not None:
            params["original_max_position_embeddings"] = top
        elif params.get("original_max_position_embeddings") is None:
            params["original_max_position_embeddings"] = max_pos

    rotary_dim = _get(config, "rotary_dim") if model_type == "gptj" else None
    if rotary_dim is None and rope_type != "proportional":
        rotary_dim = int(head_dim * prf)
    scaling = None
    if rope_type != "default":
        if rope_type not in METHODS:
            raise ValueError(
                f"config's rope_type must be one of {', '.join(map(repr, METHODS))}; got {rope_type!r}"
            )
        scaling = {"rope_type": rope_type, **params}
        if rope_type == "proportional":
            scaling["partial_rotary_factor"] = prf
    return {
        "head_dim": head_dim,
        "base": float(theta),
        "rotary_dim": rotary_dim,
        "layout": "interleaved" if model_type in INTERLEAVED_MODEL_TYPES else "half",
        "scaling": scaling,
        "max_position_embeddings": max_pos,
    }


def rotary_from_config(config) -> RotaryEmbedding:
    """A :class:`posenc.RotaryEmbedding` for a transformers config object, a config.json dict, or a model.

    Example::

        from transformers import AutoConfig
        rot = posenc.hf.rotary_from_config(AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B"))
        q, k = rot(q, k)        # (batch, heads, seq, head_dim), Hugging Face's "half" pairing
    """
    return RotaryEmbedding(**rope_settings(config))


def _half_forward(module, x, position_ids, *args, **kwargs):
    rot = module.posenc_rotary
    # transformers scales length-dependent methods for 1 + the largest position in the whole batch
    context = int(position_ids.max()) + 1 if position_ids.numel() else 1
    cos, sin = rot.cos_sin(
        position_ids.shape[-1], positions=position_ids, device=x.device, context_len=context
    )
    # transformers' rotate_half layout wants (batch, seq, rotary_dim): each frequency twice
    return torch.cat((cos, cos), dim=-1).to(x.dtype), torch.cat((sin, sin), dim=-1).to(x.dtype)


def _gptj_forward(module, x, position_ids, *args, **kwargs):
    rot = module.posenc_rotary
    context = int(position_ids.max()) + 1 if position_ids.numel() else 1
    cos, sin = rot.cos_sin(
        position_ids.shape[-1], positions=position_ids, device=x.device, context_len=context
    )
    return sin.to(x.dtype), cos.to(x.dtype)  # GPT-J's order, (batch, seq, rotary_dim/2) each


def patch_model(model, rotary: RotaryEmbedding | None = None):
    """Make a transformers model take its rotary cos/sin from posenc. Returns the model.

    Every ``*RotaryEmbedding`` submodule gets a posenc :class:`RotaryEmbedding` (built from its config by
    :func:`rotary_from_config`, or ``rotary``), stored as its ``posenc_rotary`` child, and a forward that
    returns posenc's cos/sin in the shape and order that family's attention code expects. Logits match the
    unpatched model to float32 rounding (tests/test_hf_parity.py); the angles are formed in float64, so at
    positions past ~10^5 posenc's are the accurate ones. Length-dependent methods use 1 + the largest
    position of the call, as transformers does. Undo with :func:`unpatch_model`.
    """
    found = []
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
        and not isinstance(module, RotaryEmbedding)
        and not hasattr(module, "posenc_rotary")
    ]
    for name, module in targets:
        config = getattr(module, "config", None) or model.config
        rot = rotary if rotary is not None else rotary_from_config(config)
        if hasattr(module, "embed_positions") and type(module).__name__.startswith("GPTJ"):
            forward = _gptj_forward
        elif (
            hasattr(module, "inv_freq")
            and hasattr(module, "attention_scaling")
            and _get(config, "model_type", default="") not in INTERLEAVED_MODEL_TYPES
        ):
            forward = _half_forward
        else:
            raise ValueError(
                f"patch_model does not know how {type(module).__name__} ({name}) hands out cos/sin; "
                f"supported: the rotate_half families (tested: {', '.join(PATCHED_FAMILIES)})"
            )
        module.posenc_rotary = rot.to(next(iter(module.buffers()), torch.empty(0)).device)
        module.forward = types.MethodType(forward, module)
        found.append(name)
    if not found:
        raise ValueError(f"patch_model found no *RotaryEmbedding module in {type(model).__name__}")
    return model


def unpatch_model(model):
    """Undo :func:`patch_model`: the model computes its own cos/sin again. Returns the model."""
    for module in model.modules():
        if hasattr(module, "posenc_rotary"):
            del module.forward  # the instance attribute; the class's forward shows through again
            del module.posenc_rotary
    return model


def consistent_cache(model, rotary: RotaryEmbedding | None = None):
    """A transformers ``DynamicCache`` whose cached keys follow the current RoPE schedule.

    transformers caches keys rotated with the schedule of the step that produced them; with dynamic NTK,
    dynamic YaRN or LongRoPE that schedule changes as the sequence grows, and decoding drifts from a full
    forward pass. This cache, before appending a layer's new keys, turns the cached ones from the schedule
    they were rotated with to the one for the new total length (:func:`posenc.rope.cache.rerotate_schedule`):
    for a
    one-layer model, cached decoding then equals the full forward pass at every length (tested). Use it
    with a :func:`patch_model`-ed model (the schedules are then posenc's exactly)::

        patch_model(model)
        out = model(ids, past_key_values=consistent_cache(model), use_cache=True)

    Batches must be unpadded (the total length is the cache length plus the new tokens).
    """
    from transformers import DynamicCache

    from .rope.cache import rerotate_schedule, same_schedule

    if rotary is None:
        found = [m.posenc_rotary for m in model.modules() if hasattr(m, "posenc_rotary")]
        rotary = found[0] if found else rotary_from_config(model.config)

    class RopeConsistentCache(DynamicCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rotary = rotary
            self.schedules: dict[int, tuple] = {}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            cached = self.get_seq_length(layer_idx) if layer_idx < len(self.layers) else 0
            schedule = self.rotary.frequencies(cached + key_states.shape[-2])
            old = self.schedules.get(layer_idx)
            if cached and old is not None and not same_schedule(schedule, old):
                layer = self.layers[layer_idx]
                layer.keys = rerotate_schedule(layer.keys, old, schedule, self.rotary.layout)
            self.schedules[layer_idx] = schedule
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return RopeConsistentCache(config=model.config)
