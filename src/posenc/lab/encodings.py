"""The positional encodings the laboratory trains with, by name, and RoPE's eval-time extensions.

Every scheme comes from the core (:mod:`posenc`) through a registry, so adding one is one decorated
function returning the modules the model needs:

    @register_encoding("mine")
    def _mine(cfg: GPTConfig) -> Encoding:
        return Encoding(input=..., rotary=..., alibi=...)

This module imports nothing of the laboratory but its errors, so :mod:`posenc.lab.config` can check an
encoding name against :data:`ENCODINGS` without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

import posenc

if TYPE_CHECKING:
    from posenc.lab.config import GPTConfig


@dataclass
class Encoding:
    """The positional machinery of one scheme.

    input: adds position to the embeddings, ``(B, T, D), offset -> (B, T, D)``.
    rotary: rotates q and k in every layer (RoPE), or None.
    alibi: the attention-score bias passed to :func:`posenc.attention`, or None.
    """

    input: nn.Module
    rotary: posenc.RotaryEmbedding | None = None
    alibi: posenc.ALiBi | None = None


ENCODINGS: dict[str, Callable[[GPTConfig], Encoding]] = {}


def register_encoding(name: str):
    """Decorator adding ``fn(cfg) -> Encoding`` to the registry under ``name``."""

    def wrap(fn):
        ENCODINGS[name] = fn
        return fn

    return wrap


@register_encoding("none")
def _none(cfg: GPTConfig) -> Encoding:
    # NoPE: a causal decoder can still infer position from the mask (Haviv et al. 2022).
    return Encoding(input=posenc.NoPositionalEncoding())


@register_encoding("sinusoidal")
def _sinusoidal(cfg: GPTConfig) -> Encoding:
    return Encoding(input=posenc.SinusoidalEncoding(cfg.d_model))


@register_encoding("learned")
def _learned(cfg: GPTConfig) -> Encoding:
    return Encoding(input=posenc.LearnedEmbedding(cfg.max_len, cfg.d_model))


@register_encoding("rope")
def _rope(cfg: GPTConfig) -> Encoding:
    rotary = posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base)
    return Encoding(input=posenc.NoPositionalEncoding(), rotary=rotary)


@register_encoding("alibi")
def _alibi(cfg: GPTConfig) -> Encoding:
    return Encoding(input=posenc.NoPositionalEncoding(), alibi=posenc.ALiBi(cfg.n_head))


# RoPE eval-time context extensions: the lab's name -> the Hugging Face ``rope_type`` it selects.
# pi: position interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595); ntk: NTK-aware base
# scaling (bloc97 2023); dynamic: dynamic NTK (emozilla 2023); yarn: YaRN (Peng et al. 2023,
# arxiv.org/abs/2309.00071).
EXTENSIONS: dict[str, str] = {"pi": "linear", "ntk": "ntk", "dynamic": "dynamic", "yarn": "yarn"}


def extension_scaling(method: str, factor: float, train_len: int) -> dict:
    """The ``rope_scaling`` dict of extension ``method`` (a key of :data:`EXTENSIONS`) at ``factor``."""
    scaling = {"rope_type": EXTENSIONS[method], "factor": factor}
    if method == "yarn":
        # YaRN picks which frequencies to interpolate by how many turns they make within the original context.
        scaling["original_max_position_embeddings"] = train_len
    return scaling
