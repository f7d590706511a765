"""Per-layer position plans read from a Hugging Face config: :func:`position_plan`.

Today's open models do not give every layer the same positions. A plan says, for each layer, which
encoding it gets (RoPE with which base, scaling and pairing; M-RoPE; none), which attention pattern
(full, sliding window, chunked) and which query temperature / softmax scale:

- Llama 4 (iRoPE): RoPE with chunked attention on three layers of four, none and full attention on the
  fourth, whose queries are scaled by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 (Nakanishi
  2025, "Scalable-Softmax", arxiv.org/abs/2501.19399). ``no_rope_layers[i] == 1`` means layer i HAS RoPE.
- Gemma 3: base 1e4 unscaled on sliding layers, base 1e6 (linear x8 on the large models) on global ones.
- Gemma 4: as Gemma 3 with "proportional" RoPE on global layers (frequencies base^(-2k/head_dim) for the
  first fraction of the pairs, zero for the rest: every dimension is paired, not a partial rotary) and
  their own head dimension.
- Cohere2 (Command R7B / A): interleaved RoPE on sliding layers, none on global ones.
- SmolLM3: ``no_rope_layers`` as Llama 4, without temperature or chunking.
- Multi-head latent attention (DeepSeek V2/V3/V3.2, Mistral 4, GLM-4.7-Flash, LongCat-Flash, MiniCPM3,
  ...), found by its config keys (``kv_lora_rank``, ``qk_rope_head_dim``): RoPE on the decoupled
  qk_rope_head_dim slice, with one key head shared by all heads, paired as the family's code pairs it;
  YaRN's mscale_all_dim squared multiplies the softmax scale.
- EXAONE 4: RoPE on sliding-window layers, none on full-attention ones (all RoPE without a window).
- Ministral 3 and Mistral 4: the query temperature 1 + beta ln(1 + floor(p / L0)) on every layer.
- Qwen2-VL / Qwen2.5-VL (contiguous) and Qwen3-VL (interleaved) M-RoPE (:mod:`posenc.rope.mrope`).

Anything else with a single RoPE (Llama, Qwen2, Mistral, Phi-3, ...) gets the same RoPE on every layer.
Every key of the RoPE dict goes through the check of :func:`~posenc.hf.rope_settings` that
``rotary_from_config`` and ``patch_model`` use too: a key no reader takes (``mrope_section`` in a family
without an M-RoPE reader, a temperature in a family whose attention does not apply it) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ..rope import RotaryEmbedding
from ..rope.frequencies import yarn_mscale
from ..rope.mrope import MRotaryEmbedding
from ._config import ROPE_KEYS, config_head_dim, config_value, rope_settings, temperature_keys
from .families import family, having
from .source import modeling_source

__all__ = ["LayerPlan", "QueryTemperature", "Rope", "position_plan"]

ATTENTION = ("full", "sliding", "chunked", "linear")


@dataclasses.dataclass(frozen=True)
class Rope:
    """One layer's rotary encoding. ``head_dim``: the q/k slice it acts on; ``rotary_dim``: how much of
    it rotates; ``scaling``: the Hugging Face scaling dict as sorted (key, value) pairs (hashable);
    ``mrope_section`` (pairs per position axis) and ``mrope_order`` (:data:`posenc.rope.mrope.ORDERS`) set
    for M-RoPE."""

    base: float
    head_dim: int
    rotary_dim: int
    layout: str = "half"
    scaling: tuple = ()
    max_position_embeddings: int | None = None
    mrope_section: tuple[int, ...] | None = None
    mrope_order: str = "contiguous"

    @property
    def scaling_dict(self) -> dict | None:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.scaling} or None

    def module(self) -> RotaryEmbedding | MRotaryEmbedding:
        """The posenc module computing this encoding."""
        if self.mrope_section is not None:
            return MRotaryEmbedding(
                self.head_dim,
                self.mrope_section,
                self.base,
                order=self.mrope_order,
                scaling=self.scaling_dict,
                layout=self.layout,
                rotary_dim=self.rotary_dim,
                max_position_embeddings=self.max_position_embeddings,
            )
        return RotaryEmbedding(
            self.head_dim,
            base=self.base,
            rotary_dim=self.rotary_dim,
            layout=self.layout,
            scaling=self.scaling_dict,
            max_position_embeddings=self.max_position_embeddings,
        )

    def __repr__(self) -> str:
        kind = "RoPE"
        if self.mrope_section is not None:
            kind = f"M-RoPE{list(self.mrope_section)} {self.mrope_order}"
        parts = [f"base={self.base:g}"]
        scaling = dict(self.scaling)
        if scaling.get("rope_type", "default") != "default":
            factor = scaling.get("factor")
            parts.append(scaling["rope_type"] + (f" x{factor:g}" if factor else ""))
            if "partial_rotary_factor" in scaling:
                parts.append(f"rotating {scaling['partial_rotary_factor']:g} of the pairs")
        parts.append(f"dims {self.rotary_dim}/{self.head_dim}")
        parts.append(self.layout)
        return f"{kind}({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class QueryTemperature:
    """A position-dependent query scale, s(p) = log1p(floor((p + offset) / floor_scale)) * attn_scale + 1
    (Nakanishi 2025, "Scalable-Softmax", arxiv.org/abs/2501.19399, in its log-of-blocks form).

    Llama 4's NoPE layers: ``attn_scale``, ``floor_scale`` from the config, offset 1. Ministral 3 and
    Mistral 4 (``llama_4_scaling_beta`` beta): 1 + beta ln(1 + floor(p / L0)), offset 0, L0 the
    ``original_max_position_embeddings``, on every layer.
    """

    attn_scale: float
    floor_scale: float
    offset: float = 1.0

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """s(p) for positions (..., seq), float32, computed in float64."""
        p = positions.to(torch.float64)
        blocks = torch.floor((p + self.offset) / self.floor_scale)
        return (torch.log1p(blocks) * self.attn_scale + 1.0).float()

    def __repr__(self) -> str:
        p = f"(p+{self.offset:g})" if self.offset else "p"
        return f"log1p(floor({p}/{self.floor_scale:g}))*{self.attn_scale:g}+1"


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What one layer does with positions.

    rope: the encoding, or None (NoPE). attention: "full", "sliding" (``window`` keys back), "chunked"
    (``window``-sized blocks) or "linear" (a hybrid's recurrent layer, no softmax attention). scale: the
    softmax scale multiplying q.k. temperature: a query temperature.
    shared_key: one rotated key head shared by all heads (DeepSeek's MLA).
    """

    layer: int
    rope: Rope | None
    attention: str = "full"
    window: int | None = None
    scale: float | None = None
    temperature: QueryTemperature | None = None
    shared_key: bool = False

    def __repr__(self) -> str:
        parts = [repr(self.rope) if self.rope is not None else "NoPE"]
        parts.append(self.attention + (f" {self.window}" if self.window else ""))
        if self.scale is not None:
            parts.append(f"scale {self.scale:.4g}")
        if self.temperature is not None:
            parts.append(f"query x {self.temperature!r}")
        if self.shared_key:
            parts.append("one shared key head")
        return f"layer {self.layer}: " + " | ".join(parts)


def _frozen(params: Mapping | None) -> tuple:
    if not params:
        return ()
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def _rope(settings: dict, **extra) -> Rope:
    """A :class:`Rope` from :func:`rope_settings`'s keyword arguments, checked as the module it describes
    checks its arguments (a scaling factor that is NaN or below 1, M-RoPE sections the rotary dimension
    cannot hold, ...): the one validation :func:`~posenc.hf.rotary_from_config` runs too, so a plan never
    holds an encoding posenc would refuse to build."""
    fields = {
        "base": settings["base"],
        "head_dim": settings["head_dim"],
        "rotary_dim": settings["rotary_dim"] or settings["head_dim"],
        "layout": settings["layout"],
        "scaling": _frozen(settings["scaling"]),
        "max_position_embeddings": settings["max_position_embeddings"],
    }
    rope = Rope(**{**fields, **extra})
    rope.module()  # raises the module's own ValueError, naming the argument or key and the value
    return rope


# ---------------------------------------------------------------------------------------------- readers
def _attention(layer_type: str, config) -> tuple[str, int | None]:
    if layer_type == "sliding_attention":
        return "sliding", config_value(config, "sliding_window")
    if layer_type == "chunked_attention":
        return "chunked", config_value(config, "attention_chunk_size")
    if layer_type == "full_attention":
        return "full", None
    if layer_type == "linear_attention":
        return "linear", None  # a recurrent layer of a hybrid (Gated DeltaNet, ...): no positions
    raise ValueError(
        f"config's layer_types entry {layer_type!r} is not supported; supported: 'full_attention', "
        "'sliding_attention', 'chunked_attention', 'linear_attention'"
    )


def _n_layers(config) -> int:
    n = config_value(config, "num_hidden_layers", "n_layer", "num_layers")
    if n is None:
        raise ValueError("config has no num_hidden_layers")
    return n


def _has_rope(config) -> list[int]:
    """``no_rope_layers`` (1: the layer HAS RoPE, as Llama 4 and SmolLM3 use it), or its default: a NoPE
    layer every ``no_rope_layer_interval`` layers."""
    n = _n_layers(config)
    flags = config_value(config, "no_rope_layers")
    if not flags:
        interval = config_value(config, "no_rope_layer_interval", default=4)
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n or any(f not in (0, 1, True, False) for f in flags):
        raise ValueError(
            f"config's no_rope_layers must be {n} flags of 0 (NoPE) or 1 (RoPE), got {list(flags)!r}"
        )
    return [int(f) for f in flags]


def _layer_types(config, derived) -> list[str]:
    types = config_value(config, "layer_types")
    if types is None:
        types = derived
    if len(types) != _n_layers(config):
        raise ValueError(f"config's layer_types has {len(types)} entries for {_n_layers(config)} layers")
    return list(types)


def _single_rope_plan(config, rope: Rope | None = None, scale=None) -> tuple[LayerPlan, ...]:
    temperature = _length_temperature(config)
    rope = rope or _rope(rope_settings(config, read_elsewhere=temperature_keys(config)))
    types = _layer_types(config, ["full_attention"] * _n_layers(config))
    plans = (
        LayerPlan(i, rope, *_attention(t, config), scale=scale, temperature=temperature)
        for i, t in enumerate(types)
    )
    return tuple(_recurrent(lp) if lp.attention == "linear" else lp for lp in plans)


def _recurrent(lp: LayerPlan) -> LayerPlan:
    """A hybrid's linear-attention layer: a recurrence over the sequence, with no positional encoding."""
    return LayerPlan(lp.layer, None, "linear")


def _length_temperature(config) -> QueryTemperature | None:
    """Ministral 3's and Mistral 4's query temperature, for the families whose attention applies it."""
    if not family(config_value(config, "model_type", default="")).length_temperature:
        return None
    params = config_value(config, "rope_parameters") or config_value(config, "rope_scaling") or {}
    beta, length = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
    if beta is None or not length:
        raise ValueError(
            f"config's rope_parameters need llama_4_scaling_beta and original_max_position_embeddings: "
            f"model_type {config_value(config, 'model_type')!r} scales its queries by 1 + beta "
            f"ln(1 + floor(p / original_max_position_embeddings)); got {beta!r} and {length!r}"
        )
    return QueryTemperature(float(beta), float(length), offset=0.0)


def _exaone4(config) -> tuple[LayerPlan, ...]:
    """EXAONE 4: RoPE on sliding-window layers and NoPE on full-attention ones, or RoPE everywhere when the
    config has no sliding window (its attention rotates iff ``sliding_window is None or is_sliding``)."""
    plan = _single_rope_plan(config)
    if config_value(config, "sliding_window") is None:
        return plan
    return tuple(dataclasses.replace(lp, rope=None) if lp.attention == "full" else lp for lp in plan)


def _llama4(config) -> tuple[LayerPlan, ...]:
    has_rope = _has_rope(config)
    chunk = config_value(config, "attention_chunk_size")
    derived = ["chunked_attention" if r and chunk is not None else "full_attention" for r in has_rope]
    types = _layer_types(config, derived)
    rope = _rope(rope_settings(config), layout="interleaved")  # Meta's complex pairs (2i, 2i+1)
    tuning = config_value(config, "attn_temperature_tuning", default=True)
    temperature = QueryTemperature(
        float(config_value(config, "attn_scale", default=0.1)),
        float(config_value(config, "floor_scale", default=8192)),
    )
    return tuple(
        LayerPlan(
            i,
            rope if r else None,
            *_attention(t, config),
            temperature=temperature if tuning and not r else None,
        )
        for i, (r, t) in enumerate(zip(has_rope, types, strict=True))
    )


def _smollm3(config) -> tuple[LayerPlan, ...]:
    has_rope = _has_rope(config)
    sliding = config_value(config, "use_sliding_window", default=False) and config_value(
        config, "sliding_window"
    )
    derived = ["sliding_attention" if sliding and not r else "full_attention" for r in has_rope]
    types = _layer_types(config, derived)
    rope = _rope(rope_settings(config))
    return tuple(
        LayerPlan(i, rope if r else None, *_attention(t, config))
        for i, (r, t) in enumerate(zip(has_rope, types, strict=True))
    )


def _cohere2(config) -> tuple[LayerPlan, ...]:
    n = _n_layers(config)
    pattern = config_value(config, "sliding_window_pattern", default=4)
    derived = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    types = _layer_types(config, derived)
    rope = _rope(rope_settings(config))  # "interleaved": cohere2 is in INTERLEAVED_MODEL_TYPES
    return tuple(
        LayerPlan(i, rope if t == "sliding_attention" else None, *_attention(t, config))
        for i, t in enumerate(types)
    )


def _per_type_rope(config) -> dict[str, dict]:
    """Gemma-style RoPE per layer type: transformers' ``rope_parameters`` {layer type: params}, or the
    config.json form (``rope_theta`` + ``rope_scaling`` global, ``rope_local_base_freq`` local)."""
    params = config_value(config, "rope_parameters")
    if isinstance(params, Mapping) and params and all(isinstance(v, Mapping) for v in params.values()):
        return {k: dict(v) for k, v in params.items()}
    scaling = dict(config_value(config, "rope_scaling") or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {
        "full_attention": {**scaling, "rope_theta": config_value(config, "rope_theta", default=1e6)},
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": config_value(config, "rope_local_base_freq", default=1e4),
        },
    }


def _gemma3(config) -> tuple[LayerPlan, ...]:
    n = _n_layers(config)
    pattern = config_value(config, "sliding_window_pattern", "_sliding_window_pattern", default=6)
    derived = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    types = _layer_types(config, derived)
    per_type = _per_type_rope(config)
    ropes = {t: _type_rope(config, per_type, t, config_head_dim(config)) for t in sorted(set(types))}
    scale = config_value(config, "query_pre_attn_scalar", default=config_head_dim(config)) ** -0.5
    return tuple(LayerPlan(i, ropes[t], *_attention(t, config), scale=scale) for i, t in enumerate(types))


def _global_head_dim(config) -> int:
    """Gemma 4's head dimension on full-attention layers: ``global_head_dim`` in config.json, a
    ``per_layer_config`` override in transformers' config (as a dict); else head_dim."""
    value = config_value(config, "global_head_dim")
    if value is not None:
        return value
    overrides = config_value(config, "per_layer_config")
    if isinstance(overrides, Mapping):
        for override in overrides.values():
            if isinstance(override, Mapping) and "head_dim" in override:
                return override["head_dim"]
    return config_head_dim(config)


def _gemma4(config) -> tuple[LayerPlan, ...]:
    """Gemma 3's layout, with "proportional" RoPE and their own head dimension on full layers, and a
    softmax scale of 1 (q and k are RMS-normalised per head instead)."""
    if not isinstance(config, Mapping):
        # transformers' Gemma 4 config refuses global reads of per-layer attributes; its dict has them
        config = config.to_dict()
    n = _n_layers(config)
    derived = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    types = _layer_types(config, derived)
    if types[-1] != "full_attention":
        types[-1] = "full_attention"  # as Gemma4TextConfig forces it
    per_type = _per_type_rope(config)
    head_dims = {"sliding_attention": config_head_dim(config), "full_attention": _global_head_dim(config)}
    ropes = {t: _type_rope(config, per_type, t, head_dims[t]) for t in sorted(set(types))}
    return tuple(LayerPlan(i, ropes[t], *_attention(t, config), scale=1.0) for i, t in enumerate(types))


def _type_rope(config, per_type: dict, layer_type: str, head_dim: int) -> Rope:
    if layer_type not in per_type:
        raise ValueError(
            f"config's rope_parameters has no entry for layer type {layer_type!r} (has {sorted(per_type)})"
        )
    flat = {
        "model_type": config_value(config, "model_type", default=""),
        "head_dim": head_dim,
        "max_position_embeddings": config_value(config, "max_position_embeddings"),
        "rope_parameters": per_type[layer_type],
    }
    if flat["model_type"].removesuffix("_text") in MROPE_FAMILIES:  # M-RoPE per layer type (NeoMME)
        return mrope_rope(flat)
    return _rope(rope_settings(flat))


# family (the composite model_type) -> its M-RoPE; the plan reader, the composite's text config and the
# attention adapter of each come from posenc.hf.families
MROPE_FAMILIES = having("mrope")


def mrope_rope(config) -> Rope:
    """The M-RoPE of a (text) config of a family in :data:`MROPE_FAMILIES`: its ``mrope_section`` (else the
    family's default), put in the position ids' axis order, the family's slot order and pairing; a
    ValueError for any other family."""
    name = config_value(config, "model_type", default="").removesuffix("_text")
    spec = MROPE_FAMILIES.get(name)
    if spec is None:
        raise ValueError(
            f"model_type {name!r} has no M-RoPE layout in posenc; known: {', '.join(sorted(MROPE_FAMILIES))}"
        )
    params = dict(config_value(config, "rope_parameters") or config_value(config, "rope_scaling") or {})
    listed = params.pop("mrope_section", spec.section)
    params.pop("mrope_interleaved", None)  # Qwen3-VL's configs say what its code always does
    if params.get("rope_type", params.get("type")) == "mrope":  # early Qwen2-VL configs' name for default
        params.pop("type", None)
        params["rope_type"] = "default"
    flat = {
        "model_type": name,
        "head_dim": config_head_dim(config),
        "max_position_embeddings": config_value(config, "max_position_embeddings"),
        "rope_theta": config_value(config, "rope_theta"),
        "rope_parameters": params,
    }
    settings = rope_settings(flat)
    if listed is None:  # the pairs split evenly over the axes
        pairs = (settings["rotary_dim"] or settings["head_dim"]) // 2
        listed = [pairs // spec.axes] * spec.axes
    section = tuple(listed)
    if spec.listed is not None and len(section) == len(spec.listed):
        section = tuple(section[spec.listed.index(axis)] for axis in range(len(section)))
    return _rope({**settings, "layout": spec.layout}, mrope_section=section, mrope_order=spec.order)


def _qwen_vl(config) -> tuple[LayerPlan, ...]:
    return _single_rope_plan(config, mrope_rope(config))


MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim")
"""The config keys that give DeepSeek's multi-head latent attention away, whatever the model_type."""


def _mla(config) -> tuple[LayerPlan, ...]:
    """DeepSeek's MLA (DeepSeek-AI 2024, arxiv.org/abs/2405.04434): RoPE on the decoupled
    ``qk_rope_head_dim`` slice of q and of one key head shared by all heads; softmax scale
    (qk_nope + qk_rope)^-1/2, times YaRN's mscale(factor, mscale_all_dim)^2 for a scaled RoPE. The slice's
    layout is what the family's code does (:attr:`~posenc.hf.families.Family.mla`)."""
    model_type = config_value(config, "model_type", default="")
    settings = rope_settings(config, read_elsewhere=temperature_keys(config))
    layout = family(model_type).mla
    if layout is None:
        raise ValueError(
            f"config of model_type {model_type!r} has {' and '.join(MLA_KEYS)}: multi-head latent attention, "
            "whose pairing of the rotated slice and softmax scale live in each family's code; posenc has "
            f"read those of {', '.join(having('mla'))}"
        )
    rope_dim, nope_dim = (
        config_value(config, "qk_rope_head_dim"),
        config_value(config, "qk_nope_head_dim", default=0),
    )
    if (settings["rotary_dim"] or settings["head_dim"]) != rope_dim:
        raise ValueError(
            f"config's RoPE rotates {settings['rotary_dim']} dimensions (head_dim {settings['head_dim']}), "
            f"but its qk_rope_head_dim is {rope_dim}: posenc does not know which its attention uses"
        )
    if layout == "config":
        layout = "interleaved" if config_value(config, "rope_interleave", default=True) else "half"
    rope = _rope({**settings, "head_dim": rope_dim, "rotary_dim": rope_dim}, layout=layout)
    scale = (rope_dim + nope_dim) ** -0.5
    params = config_value(config, "rope_parameters") or config_value(config, "rope_scaling") or {}
    mscale_all_dim = params.get("mscale_all_dim")
    if params.get("rope_type", params.get("type", "default")) != "default" and mscale_all_dim:
        scale *= yarn_mscale(params["factor"], mscale_all_dim) ** 2  # DeepSeek's YaRN
    return tuple(
        dataclasses.replace(lp, scale=scale, shared_key=True) for lp in _single_rope_plan(config, rope)
    )


_READER_FUNCTIONS = {
    "llama4": _llama4,
    "smollm3": _smollm3,
    "cohere2": _cohere2,
    "gemma3": _gemma3,
    "gemma4": _gemma4,
    "qwen_vl": _qwen_vl,
    "mla": _mla,
    "exaone4": _exaone4,
}
READERS = {name: _READER_FUNCTIONS[reader] for name, reader in having("plan").items()}
"""model_type -> the function reading its plan (composite configs are read through their text_config)."""

_COMPOSITE = set(having("composite"))
_HANDLED_KEYS = {
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rope_local_base_freq",
    "global_head_dim",
    "no_rope_layers",
    "no_rope_layer_interval",
    "qk_rope_head_dim",
    "rope_interleave",
    "attn_temperature_tuning",
    "attention_chunk_size",
    "partial_rotary_factor",
    "rotary_pct",
    "rotary_dim",
    "rotary_emb_base",
}
_POSITION_WORDS = ("rope", "rotary", "temperature", "chunk_size", "position_embedding_type")
_IGNORED_KEYS = {"chunk_size_feed_forward"}


def text_config(config):
    """The language model's config of a composite (vision-language) config: a family known to be one, or
    any config with a ``text_config`` and no RoPE keys of its own; the config itself otherwise."""
    if isinstance(config, torch.nn.Module) and hasattr(config, "config"):
        config = config.config
    model_type = config_value(config, "model_type", default="")
    inner = config_value(config, "text_config")
    if inner is not None and (model_type in _COMPOSITE or not _has_rope_keys(config)):
        inner_type = config_value(inner, "model_type") or f"{model_type}_text"
        if isinstance(inner, Mapping):
            inner = {**inner, "model_type": inner_type}
        return inner
    return config


def _has_rope_keys(config) -> bool:
    return any(config_value(config, key) is not None for key in ROPE_KEYS)


def _check_keys(config) -> None:
    """Refuse position-related keys that no reader understands, naming them."""
    keys = config.keys() if isinstance(config, Mapping) else config.to_dict().keys()
    for key in sorted(keys):
        if key in _HANDLED_KEYS or key in _IGNORED_KEYS or not any(w in key for w in _POSITION_WORDS):
            continue
        raise ValueError(
            f"config key {key!r} is not supported by posenc.hf.position_plan: it would change positions in "
            "a way posenc does not know"
        )


def position_plan(config) -> tuple[LayerPlan, ...]:
    """The per-layer position plan of a transformers config (object, config.json dict, or model).

    Returns one frozen :class:`LayerPlan` per decoder layer. Raises ValueError naming any config key or
    value posenc cannot follow (an unknown rope_type, a layer type other than full / sliding / chunked
    attention, a position-related key no reader knows).
    """
    config = text_config(config)
    if not isinstance(config, Mapping) and not hasattr(config, "model_type"):
        raise ValueError(
            "config must be a transformers config, a config.json dict or a model, got "
            f"{type(config).__name__}"
        )
    _check_keys(config)
    model_type = config_value(config, "model_type", default="")
    reader = READERS.get(model_type)
    if reader is not None:
        return reader(config)
    known_mrope = model_type.removesuffix("_text") in MROPE_FAMILIES
    if not known_mrope and "mrope_section" in modeling_source(model_type):
        raise ValueError(
            f"model_type {model_type!r}'s code lays out M-RoPE sections (positions on several axes), whose "
            f"layout posenc does not know; known: {', '.join(sorted(MROPE_FAMILIES))}"
        )
    if all(config_value(config, key) is not None for key in MLA_KEYS):
        return _mla(config)
    if config_value(config, "layer_types") and isinstance(config_value(config, "rope_parameters"), Mapping):
        if all(isinstance(v, Mapping) for v in config_value(config, "rope_parameters").values()):
            return _gemma3(config)  # any other per-layer-type family follows Gemma 3's rules
    return _single_rope_plan(config)
