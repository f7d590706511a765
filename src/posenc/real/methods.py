"""The context-extension methods ``posenc extend`` compares, and what each gives a real model.

A frequency method replaces the model's rotary embedding with a :class:`posenc.RotaryEmbedding` through
:func:`posenc.hf.patch_model`, so posenc computes every position (float64 angles) and the method's
frequencies reach every layer; its factor is the longest evaluated length over the trained length N, as
an engineer extending a model to that length would set it. A training-free method keeps the model's RoPE
and remaps distances in attention (:mod:`posenc.remap`, ``patch_model(model, remap=...)``), with
parameters derived from N and the longest length (:func:`method_remap`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping

import torch

from posenc.hf import patch_model, rope_settings, text_config, unpatch_model
from posenc.hf.layers import ADAPTERS
from posenc.remap import STRING, DualChunk, Remap, ReRoPE, SelfExtend
from posenc.rope import RotaryEmbedding
from posenc.rope.frequencies import extension_scaling

__all__ = [
    "EXTEND_METHODS",
    "REMAP_METHODS",
    "applied",
    "check_applicable",
    "check_extendable",
    "method_remap",
    "method_rotary",
    "sliding_window",
    "trained_length",
]

# name -> what it does, with its source; "none" is the model as its config describes it.
EXTEND_METHODS: dict[str, str] = {
    "none": "the model as trained: its config's RoPE, no extension",
    "pi": "position interpolation, each frequency divided by the factor (Chen et al. 2023, arXiv:2306.15595)",
    "ntk": "static NTK-aware scaling, base times factor^(d/(d-2)) (bloc97 2023)",
    "dynamic": "dynamic NTK, the NTK base recomputed from the sequence length past the trained length "
    "(emozilla 2023)",
    "yarn": "YaRN, interpolation ramped by frequency plus an attention temperature (Peng et al. 2023, "
    "arXiv:2309.00071)",
    "llama3": "Llama 3.1's scaling by wavelength band, low/high frequency factors 1 and 4 (Meta 2024, "
    "arXiv:2407.21783)",
    "selfextend": "SelfExtend, neighbour attention inside N/4 tokens and grouped positions beyond, the "
    "smallest group that maps the longest length inside N (Jin et al. 2024, arXiv:2401.01325)",
    "rerope": "ReRoPE, every distance past N/4 held at N/4 (Su 2023)",
    "leaky-rerope": "leaky ReRoPE, distances past N/4 grow 1/k as fast, the smallest k that keeps the "
    "longest length inside N (Su 2023)",
    "string": "STRING, distances past 0.33 N shifted down to W = 128 (N/16 for N below 2048, so that W stays "
    "below the shift), cos and sin times 0.1 ln 2 + 1, as its released code (An et al. 2024, "
    "arXiv:2410.18745); made to use the trained length better, it cannot map more than N tokens inside N",
    "dca": "Dual Chunk Attention, chunks of N - N/32 tokens (the proportions of Qwen2.5-1M's config), "
    "positions as vLLM's (An et al. 2024, arXiv:2402.17463)",
}
REMAP_METHODS = ("selfextend", "rerope", "leaky-rerope", "string", "dca")
# Frequency methods whose schedule at factor 1 is, by definition, the unscaled one: PI divides by 1, NTK
# multiplies the base by 1, YaRN's ramp interpolates by 1 and its temperature 0.1 ln 1 + 1 is 1, Llama 3.1
# divides its low band by 1 and blends 1 with 1. (Dynamic NTK at factor 1 still grows its base past N.)
IDENTITY_AT_FACTOR_1 = ("pi", "ntk", "yarn", "llama3")
# STRING's released setting: the shift at 0.33 N and a local window of 128 tokens for N >= 2048; below,
# the window keeps that proportion, N / 16, so that it stays below the shift (equal, STRING is the identity).
STRING_SHIFT, STRING_WINDOW, STRING_WINDOW_FROM = 0.33, 128, 2048


def _get(config, name: str):
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def trained_length(config) -> int:
    """The context the model was pretrained at: ``original_max_position_embeddings`` (top level, or in
    ``rope_parameters`` / ``rope_scaling``) when the config has one, else ``max_position_embeddings``."""
    config = text_config(config)
    for params in (config, _get(config, "rope_parameters") or {}, _get(config, "rope_scaling") or {}):
        value = _get(params, "original_max_position_embeddings")
        if value:
            return int(value)
    value = _get(config, "max_position_embeddings")
    if not value:
        raise ValueError(
            "the model's config has neither max_position_embeddings nor original_max_position_embeddings: "
            "give its trained length with --train-len"
        )
    return int(value)


def check_extendable(config) -> None:
    """A ValueError, before any work, when the model of this transformers ``config`` (or the model itself) is
    not one posenc can give a single RoPE to."""
    config = text_config(config)
    model_type = _get(config, "model_type") or ""
    if model_type in ADAPTERS:
        raise ValueError(
            f"posenc extend compares methods on single-RoPE models; {model_type} has a per-layer position "
            "plan (posenc.hf.position_plan), which it does not vary yet"
        )
    rope_settings(config)  # a ValueError when the config describes no RoPE


def sliding_window(config) -> int | None:
    """The window of the model's sliding-window attention (``sliding_window``, on every layer, or on the
    layers ``layer_types`` calls "sliding_attention"), None when it attends to every key."""
    config = text_config(config)
    window = _get(config, "sliding_window")
    types = _get(config, "layer_types")
    if not window or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def check_applicable(config, method: str, remap: Remap | None) -> None:
    """A ValueError naming ``method``, before any work, when the model of ``config`` cannot run it at all:
    a remap that bands distances in chunks (Dual Chunk Attention) on a model with sliding-window attention,
    whose window counts tokens."""
    window = sliding_window(config)
    if remap is None or window is None:
        return
    probe = torch.arange(2, dtype=torch.int64)
    if any(v.unit != 1 for v in remap.views(probe, probe)):
        raise ValueError(
            f"--methods {method}: {remap!r} bands distances in chunks, and this model's attention keeps "
            f"a sliding window of {window} tokens (its config's sliding_window), which posenc applies to "
            f"token distances only; leave {method} out of --methods"
        )


def method_rotary(config, method: str, *, factor: float, train_len: int | None = None) -> RotaryEmbedding:
    """The :class:`~posenc.RotaryEmbedding` that ``method`` (a key of :data:`EXTEND_METHODS`) gives a model
    with this transformers ``config``, extended by ``factor`` from ``train_len`` (default
    :func:`trained_length`). "none" and the training-free methods keep the config's own RoPE, its scaling
    included (a remap stacks on it); a frequency method replaces the config's scaling with its own, which at
    factor 1 is no scaling for :data:`IDENTITY_AT_FACTOR_1`."""
    if method not in EXTEND_METHODS:
        raise ValueError(f"method must be one of {', '.join(EXTEND_METHODS)}; got {method!r}")
    settings = rope_settings(text_config(config))
    if method != "none" and method not in REMAP_METHODS:
        train_len = trained_length(config) if train_len is None else train_len
        # A frequency method replaces the config's scaling; at a factor where its definition makes it the
        # identity it is the unscaled RoPE, built as such (so that its schedule is the plain one bit for bit)
        identity = method in IDENTITY_AT_FACTOR_1 and factor == 1
        settings["scaling"] = None if identity else extension_scaling(method, factor, train_len)
        settings["max_position_embeddings"] = train_len  # where dynamic NTK starts to scale
    return RotaryEmbedding(**settings)


def method_remap(method: str, *, train_len: int, longest: int) -> Remap | None:
    """The remap of a training-free ``method`` for a model trained at ``train_len`` tokens run at up to
    ``longest`` (None for the frequency methods); parameters as :data:`EXTEND_METHODS` says. A ValueError
    naming ``--train-len`` where the method would remap nothing (STRING below a few tokens)."""
    if method not in REMAP_METHODS:
        return None
    window = max(1, train_len // 4)
    if method == "rerope":
        return ReRoPE(window)
    if method == "selfextend":
        # f(d) = d // g + W - W // g >= (d - W + 1) / g + W - 1, so no g below (d - W + 1) / (N - W) keeps
        # d = longest - 1 inside N: start the search there, not at 1 (a few steps whatever the length)
        far, room = longest - 1, max(1, train_len - window)
        group = max(1, -(-(far - window + 1) // room) - 1)
        while SelfExtend(group, window).distance(far) > train_len - 1 and group < longest:
            group += 1
        return SelfExtend(group, window)
    if method == "leaky-rerope":
        slope = (longest - 1 - window) / max(1, train_len - 1 - window)
        return ReRoPE(window, leaky=max(1.01, math.ceil(slope * 100) / 100))
    if method == "dca":
        return DualChunk(train_len, train_len // 32)
    shift = int(STRING_SHIFT * train_len)
    local = STRING_WINDOW if train_len >= STRING_WINDOW_FROM else max(1, train_len // 16)
    if local >= shift:
        raise ValueError(
            f"--methods string: at --train-len {train_len} STRING's shift ({shift}, 0.33 N) is not above its "
            f"local window ({local}), so it would remap no distance; it needs a trained length of at least "
            f"{_STRING_SHORTEST}"
        )
    return STRING(shift, local, attention_factor=0.1 * math.log(2) + 1)


# the shortest trained length at which STRING's shift lies above its window (int(0.33 * 7) = 2 > 1)
_STRING_SHORTEST = next(n for n in range(1, STRING_WINDOW_FROM) if int(STRING_SHIFT * n) > max(1, n // 16))


@contextlib.contextmanager
def applied(model, rotary: RotaryEmbedding, remap: Remap | None = None) -> Iterator[torch.nn.Module]:
    """``model`` with ``rotary`` computing its positions (:func:`posenc.hf.patch_model`), at ``remap``'s
    distances if given; restored after."""
    patch_model(model, rotary=rotary, remap=remap)
    try:
        yield model
    finally:
        unpatch_model(model)
