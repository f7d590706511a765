"""Reading a transformers config's RoPE: :func:`rope_settings` and :func:`rotary_from_config`."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from ..rope import RotaryEmbedding
from ..rope.frequencies import ROPE_TYPES
from .families import family, having

__all__ = ["INTERLEAVED_MODEL_TYPES", "rope_settings", "rotary_from_config"]

# Families whose transformers code pairs dimensions (2i, 2i+1), for reading a config alone; every other RoPE
# family in transformers (Llama, Mistral, Qwen2, GPT-NeoX, Phi-3, Gemma, ...) uses rotate_half, pairs
# (i, i + r/2). patch_model does not rely on this list: it reads the layout off the hand-out form of each
# model's rotary module. (A view of posenc.hf.families.FAMILIES, as every family table.)
INTERLEAVED_MODEL_TYPES = frozenset(having("interleaved"))


def config_value(config, *names, default=None):
    for name in names:
        try:
            value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        except RuntimeError as e:
            # transformers' heterogeneous configs refuse a global read of a per-layer key
            raise ValueError(
                f"config's {name} differs from layer to layer (per_layer_config), which posenc does not read "
                f"here: {e}"
            ) from None
        if value is not None:
            return value
    return default


def config_head_dim(config) -> int:
    head_dim = config_value(config, "head_dim")
    if head_dim is not None:
        return head_dim
    hidden = config_value(config, "hidden_size", "n_embd", "d_model")
    heads = config_value(config, "num_attention_heads", "n_head")
    if hidden is None or heads is None:
        raise ValueError("config has neither head_dim nor hidden_size and num_attention_heads")
    return hidden // heads


# A config with RoPE carries at least one of these (transformers 5 standardises rope_parameters; older
# config.json files name rope_theta or rope_scaling; GPT-NeoX / GPT-J their rotary fraction or width).
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_pct", "rotary_dim", "rotary_emb_base")
# RoPE families whose config.json may name none of them (early Llama files relied on the default theta).
_ROPE_MODEL_TYPES = frozenset(having("rope_implied"))


def rope_settings(config, *, read_elsewhere: Collection[str] = ()) -> dict:
    """The keyword arguments of :class:`posenc.RotaryEmbedding` a transformers config describes.

    Follows ``RotaryEmbeddingConfigMixin.standardize_rope_params``: ``rope_parameters`` or the older
    ``rope_scaling`` + ``rope_theta``; partial rotary from the dict, ``partial_rotary_factor``, GPT-NeoX's
    ``rotary_pct`` or GPT-J's ``rotary_dim``; a top-level ``original_max_position_embeddings`` (Phi-3)
    takes precedence, else it defaults to max_position_embeddings for llama3 / yarn / longrope.

    Every key of the RoPE dict is accounted for, the one check behind both :func:`rotary_from_config`
    (and so ``patch_model``) and ``position_plan``: the frequency method's own keys, a copy of
    ``max_position_embeddings`` (which transformers' RoPE code never reads there), HunYuan's ``alpha``,
    and the keys the caller reads itself (``read_elsewhere``: M-RoPE's sections, a length temperature).
    Any other key raises a ValueError naming it, before any work.
    """
    config = _rope_config(config)
    model_type = config_value(config, "model_type", default="")
    head_dim = config_head_dim(config)
    max_pos = config_value(config, "max_position_embeddings", "n_positions")
    params = _rope_parameters(config)
    for key in ("max_position_embeddings", *read_elsewhere):
        params.pop(key, None)
    theta = params.pop("rope_theta", None) or config_value(
        config, "rope_theta", "rotary_emb_base", default=10000.0
    )
    prf = params.pop("partial_rotary_factor", None) or config_value(
        config, "partial_rotary_factor", "rotary_pct", default=1.0
    )
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    known = family(model_type)
    rope_type = dict(known.rope_type_aliases).get(rope_type, rope_type)  # as the config class renames it
    if known.ntk_alpha and rope_type == "dynamic" and params.get("alpha"):
        # HunYuan's checkpoints label static NTK "dynamic"; its code reads alpha and ignores the factor
        rope_type, params = "ntk", {"factor": params["alpha"]}
    if rope_type in ("llama3", "yarn", "longrope"):
        top = config_value(config, "original_max_position_embeddings")
        if top is not None:
            params["original_max_position_embeddings"] = top
        elif params.get("original_max_position_embeddings") is None:
            params["original_max_position_embeddings"] = max_pos

    rotary_dim = config_value(config, known.rotary_width) if known.rotary_width else None
    if rotary_dim is None and rope_type != "proportional":
        rotary_dim = int(head_dim * prf)
    return {
        "head_dim": head_dim,
        "base": float(theta),
        "rotary_dim": rotary_dim,
        "layout": "interleaved" if model_type in INTERLEAVED_MODEL_TYPES else "half",
        "scaling": _scaling(rope_type, params, prf),
        "max_position_embeddings": max_pos,
    }


def _rope_config(config):
    """The config of a model or the config itself, once it is a config that describes RoPE; else a
    ValueError saying what it is."""
    if isinstance(config, torch.nn.Module) and hasattr(config, "config"):
        config = config.config
    if not isinstance(config, Mapping) and not hasattr(config, "model_type"):
        raise ValueError(
            "config must be a transformers config, a config.json dict or a model, got "
            f"{type(config).__name__}"
        )
    model_type = config_value(config, "model_type", default="")
    if model_type not in _ROPE_MODEL_TYPES and not any(
        config_value(config, key) is not None for key in ROPE_KEYS
    ):
        raise ValueError(
            f"config (model_type={model_type!r}) describes no rotary embedding: it has none of "
            f"{', '.join(ROPE_KEYS)}; its model uses another positional encoding"
        )
    return config


def _rope_parameters(config) -> dict:
    """A copy of the config's one RoPE dict (``rope_parameters`` or ``rope_scaling``; {} when neither)."""
    params = config_value(config, "rope_parameters") or config_value(config, "rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"config's rope_parameters / rope_scaling must be a dict, got {params!r}")
    if params and all(isinstance(v, Mapping) or v is None for v in params.values()):
        raise ValueError(
            f"per-layer-type rope_parameters (keys {sorted(params)}) are not supported: build one "
            "RotaryEmbedding per layer type with posenc.RotaryEmbedding(..., "
            "scaling=config.rope_parameters[type])"
        )
    return dict(params)


def _scaling(rope_type: str, params: dict, prf: float) -> dict | None:
    """RotaryEmbedding's ``scaling`` for a method and its remaining parameters (None: plain RoPE), each key
    checked against what the method takes."""
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"config's rope_type must be one of {', '.join(map(repr, ROPE_TYPES))}; got {rope_type!r}"
        )
    method = ROPE_TYPES[rope_type]
    unknown = sorted(set(params) - set(method.required) - set(method.optional))
    if unknown:
        raise ValueError(
            f"config's RoPE parameters have {', '.join(map(repr, unknown))}, which posenc does not know for "
            f"rope_type {rope_type!r} (it takes {sorted({*method.required, *method.optional}) or 'no keys'} "
            "besides rope_type, rope_theta and partial_rotary_factor): they would change positions in a way "
            "posenc would not reproduce"
        )
    if rope_type == "default":
        return None
    scaling = {"rope_type": rope_type, **params}
    if rope_type == "proportional":
        scaling["partial_rotary_factor"] = prf
    return scaling


def temperature_keys(config) -> tuple[str, ...]:
    """The RoPE-dict keys of a length temperature that ``config``'s model applies to its queries itself
    (Ministral 3's and Mistral 4's ``llama_4_scaling_beta``): not part of its cos/sin."""
    applies = family(config_value(config, "model_type", default="")).length_temperature
    return ("llama_4_scaling_beta",) if applies else ()


def rotary_from_config(config) -> RotaryEmbedding:
    """A :class:`posenc.RotaryEmbedding` for a transformers config object, a config.json dict, or a model.

    Example::

        from transformers import AutoConfig
        rot = posenc.hf.rotary_from_config(AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B"))
        q, k = rot(q, k)        # (batch, heads, seq, head_dim), Hugging Face's "half" pairing

    A config with a query temperature in its RoPE dict (Ministral 3's) is refused: a RotaryEmbedding alone
    cannot carry it (:func:`~posenc.hf.position_plan` describes both).
    """
    return RotaryEmbedding(**rope_settings(config))
