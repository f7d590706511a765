"""The laboratory's built-in positional encodings, one registry entry each (:mod:`posenc.lab.registry`).

Adding a scheme is one decorated function:

    @register_encoding("mine", extensions=("temp",))
    def _mine(cfg: ModelShape) -> Encoding:
        return Encoding(input=..., rotary=..., bias=...)

A researcher's own scheme needs no edit here: ``--schemes package.module:function`` (or
``path/to/file.py:function``) imports ``function(cfg) -> Encoding`` on first use (:func:`lookup`). The
schemes whose layers differ (SWAN, Gemma's local/global, SmolLM3's NoPE layers, partial RoPE, RoPE at
Men et al.'s base bound) and the layer kinds only a per-layer plan uses are in :mod:`posenc.lab.layered`.

An :class:`~posenc.lab.encoding.Encoding` is everything the model reads about positions: an input
encoding, a rotary, a score bias (shared or one per layer), randomized positions, attention sinks, a query
scale per row (SSMax's s log n, :class:`~posenc.lab.encoding.QueryScale`), a sliding window, an encoding
per layer, and two modifiers that extensions set and that combine with the rest: an attention window
(blockwise causal attention) and a score scale. :func:`eval_extension` applies one of a scheme's
extensions to a model for a block.

This module re-exports the registry's names (:data:`ENCODINGS`, :func:`register_encoding`,
:func:`lookup`, ...) and the model's :func:`~posenc.lab.layers.build`, so that a scheme's author imports
one module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

import posenc
from posenc.lab import layered
from posenc.lab.checks import check_choice
from posenc.lab.encoding import Encoding, KeyTerm, QueryScale, QueryTerm, floored_log_length
from posenc.lab.errors import LabError
from posenc.lab.extensions import EXTENSIONS, ROPE_EXTENSIONS
from posenc.lab.layers import build, rotary_dims
from posenc.lab.recipes import RECIPES, pose_positions
from posenc.lab.registry import (
    ENCODINGS,
    ModelShape,
    Scheme,
    extensions_for,
    lookup,
    model_extensions,
    register_encoding,
    registered_names,
    schemes_with,
)

__all__ = [
    "BUILTIN",
    "ENCODINGS",
    "EXTENSIONS",
    "Encoding",
    "ModelShape",
    "Scheme",
    "build",
    "eval_extension",
    "expand_schemes",
    "extensions_for",
    "layered",
    "lookup",
    "model_extensions",
    "register_encoding",
    "registered_names",
    "schemes_with",
]


@register_encoding("none", extensions=("temp",))
def _none(cfg: ModelShape) -> Encoding:
    # NoPE: a causal decoder can still infer position from the mask (Haviv et al. 2022).
    return Encoding(input=posenc.NoPositionalEncoding())


@register_encoding("sinusoidal", pairs="d_model")
def _sinusoidal(cfg: ModelShape) -> Encoding:
    return Encoding(input=posenc.SinusoidalEncoding(cfg.d_model))


@register_encoding("learned")
def _learned(cfg: ModelShape) -> Encoding:
    return Encoding(input=posenc.LearnedEmbedding(cfg.max_len, cfg.d_model))


@register_encoding(
    "rope",
    extensions=ROPE_EXTENSIONS,
    pairs="head_dim",
    recipes=tuple(RECIPES),
    options={"base": float, "frac": float},
)
def _rope(cfg: ModelShape, base: float | None = None, frac: float = 1.0) -> Encoding:
    """RoPE (Su et al. 2021) at ``base`` (default the config's) on the first ``frac`` of each head's
    dimensions, the rest left unrotated (partial RoPE, as GPT-NeoX's rotary_pct); a recipe's model
    (posenc.lab.recipes) scaled past the training length, with PoSE's positions in training."""
    scaling = getattr(cfg, "rope_scaling", None)
    rotary = posenc.RotaryEmbedding(
        cfg.head_dim,
        base=cfg.rope_base if base is None else base,
        rotary_dim=rotary_dims(cfg.head_dim, frac),
        scaling=scaling,
        max_position_embeddings=cfg.max_len if scaling else None,
    )
    pose = getattr(cfg, "pose_len", None)
    return Encoding(
        rotary=rotary, train_positions=None if pose is None else functools.partial(pose_positions, pose)
    )


@register_encoding("alibi")
def _alibi(cfg: ModelShape) -> Encoding:
    return Encoding(bias=posenc.ALiBi(cfg.n_head))


@register_encoding("t5")
def _t5(cfg: ModelShape) -> Encoding:
    # Raffel et al. 2020: a learned bias per (bucketed) relative distance and head
    return Encoding(bias=posenc.T5Bias(cfg.n_head))


@register_encoding("kerple")
def _kerple(cfg: ModelShape) -> Encoding:
    # Chi et al. 2022, the logarithmic kernel (their best extrapolating variant)
    return Encoding(bias=posenc.KerpleBias(cfg.n_head, kind="log"))


@register_encoding("sandwich")
def _sandwich(cfg: ModelShape) -> Encoding:
    # Chi et al. 2023: parameter-free, from the sinusoidal inner product
    return Encoding(bias=posenc.SandwichBias(cfg.n_head))


@register_encoding("fire")
def _fire(cfg: ModelShape) -> Encoding:
    # Li et al. 2023; its threshold starts at the training length (see posenc.FireBias)
    return Encoding(bias=posenc.FireBias(cfg.n_head, train_len=cfg.max_len))


@register_encoding("xpos", extensions=("bca",), pairs="head_dim")
def _xpos(cfg: ModelShape) -> Encoding:
    # Sun et al. 2022: RoPE with a per-pair decay; evaluated past the training length with blockwise causal
    # attention (the "bca" extension), as in the paper
    return Encoding(rotary=posenc.XPos(cfg.head_dim, base=cfg.rope_base))


@register_encoding("shaw")
def _shaw(cfg: ModelShape) -> Encoding:
    # Shaw et al. 2018: learned key and value vectors per clipped distance (k = 16, the paper's), one pair of
    # tables per layer shared by its heads
    return Encoding(layer_bias=lambda: posenc.ShawRelative(cfg.head_dim, max_distance=16))


@register_encoding("cope")
def _cope(cfg: ModelShape) -> Encoding:
    # Golovneva et al. 2024: positions counted by gates on the query-key scores; one position table per layer
    # with the training length + 1 entries, as their code (a count runs from 0 to the keys a query sees)
    return Encoding(layer_bias=lambda: posenc.CoPE(cfg.head_dim, npos_max=cfg.max_len + 1))


@register_encoding("rope-sinks", pairs="head_dim")
def _rope_sinks(cfg: ModelShape) -> Encoding:
    # RoPE with a learned attention sink per head and layer (Xiao et al. 2023; GPT-OSS's form): each softmax
    # row can put weight on "nothing", so no token has to serve as the sink
    return Encoding(rotary=posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base), sinks=True)


@register_encoding("rope-ssmax", pairs="head_dim")
def _rope_ssmax(cfg: ModelShape) -> Encoding:
    """RoPE with scalable softmax (SSMax; Nakanishi 2025, arxiv.org/abs/2501.19399), as the paper tests it:
    the query of a row that sees n keys times s_h log(n), s learned per head and layer.

    s starts at 1 / log(L), L the training length: a row that sees L keys then attends exactly as plain
    softmax, so training starts from RoPE at the length it trains at, shorter rows a little cooler; past L
    the scale keeps growing as log(n) / log(L), the log-length sharpening SSMax is for, which training can
    steepen or flatten per head.
    """
    if cfg.max_len < 2:
        raise LabError(
            f"encoding='rope-ssmax' needs max_len >= 2 (s starts at 1 / log(max_len)), got {cfg.max_len}"
        )
    scale = QueryScale(length=torch.log, init=1.0 / math.log(cfg.max_len))
    return Encoding(rotary=posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base), query_scale=scale)


@register_encoding("fope", pairs="head_dim")
def _fope(cfg: ModelShape) -> Encoding:
    # Hua et al. 2024 (posenc.FoPE): a Fourier series per pair and head, fixed coefficients drawn with the
    # paper's sigma = 0.3 (its 60M model's), the frequencies that do not complete a period in the training
    # length clipped to zero
    return Encoding(rotary=posenc.FoPE(cfg.head_dim, cfg.n_head, train_len=cfg.max_len, base=cfg.rope_base))


@register_encoding("fox")
def _fox(cfg: ModelShape) -> Encoding:
    # Lin et al. 2025, plain FoX: NoPE and a forget gate per head from each layer's normalised hidden state,
    # the decay bias sum of log f between key and query; the cache keeps the cached keys' log-gates
    return Encoding(hidden_terms=lambda: KeyTerm(posenc.ForgetGate(cfg.d_model, cfg.n_head)))


@register_encoding("banded")
def _banded(cfg: ModelShape) -> Encoding:
    """Inkling's RoPE-free attention (Thinking Machines Lab 2026): NoPE, a banded bias r_i . P[:, i - j] over
    the last extent keys in every layer (posenc.BandedRelative), and Inkling's fixed temperature
    1 + 0.1 log(max(n / L, 1)) on the whole row (q and r). d_rel = 16, Inkling's; extent = L / 2: Inkling's
    band (1024) is far shorter than its context, and L / 2 keeps every distance of the band trained by half
    of each sequence's rows. The floor L (Inkling's 128000, about its training context) keeps training at
    1."""
    extent = max(1, cfg.max_len // 2)
    length = functools.partial(floored_log_length, floor=cfg.max_len, alpha=0.1)
    return Encoding(
        hidden_terms=lambda: QueryTerm(
            posenc.BandedRelative(cfg.d_model, cfg.n_head, d_rel=16, extent=extent)
        ),
        query_scale=QueryScale(length=length, init=1.0, learned=False),
    )


# Randomized positions (Ruoss et al. 2023) sample from a range as long as the longest evaluation of the quick
# preset (16 x the training length), so that every position seen at evaluation was seen in training.
RANDOM_RANGE_MULTIPLE = 16


@register_encoding("rope-random", pairs="head_dim")
def _rope_random(cfg: ModelShape) -> Encoding:
    return Encoding(
        rotary=posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base),
        random_positions=RANDOM_RANGE_MULTIPLE * cfg.max_len,
    )


@register_encoding("sinusoidal-random", pairs="d_model")
def _sinusoidal_random(cfg: ModelShape) -> Encoding:
    return Encoding(
        input=posenc.SinusoidalEncoding(cfg.d_model), random_positions=RANDOM_RANGE_MULTIPLE * cfg.max_len
    )


# the schemes above, in the order `--schemes all` runs them (those of posenc.lab.layered run by their names)
BUILTIN = tuple(name for name, s in ENCODINGS.items() if s.build.__module__ == __name__)


def expand_schemes(names) -> tuple[str, ...]:
    """``names`` with ``"all"`` replaced by every built-in scheme; each name checked by :func:`lookup`."""
    unknown = [n for n in names if n != "all" and n not in ENCODINGS and ":" not in str(n)]
    if unknown:
        raise LabError(
            f"schemes={list(names)!r}: unknown {unknown}; allowed: all, {', '.join(registered_names())}, "
            "or your own as 'package.module:function' / 'path/to/file.py:function'"
        )
    out: list[str] = []
    for name in names:
        for n in BUILTIN if name == "all" else (name,):
            lookup(n)
            if n not in out:
                out.append(n)
    return tuple(out)


@contextmanager
def eval_extension(model, method: str | None, factor: float, train_len: int) -> Iterator:
    """Inside the block ``model`` (a :class:`posenc.lab.model.GPT`) uses eval-time extension ``method`` at
    ``factor``; after, its own encoding.

    Args:
        method: a key of :data:`EXTENSIONS` that applies to the model's scheme (RoPE's pi/ntk/dynamic/yarn,
            xPos's bca, NoPE's temp), or None for no change (so a caller evaluating with and without
            extensions needs no branch).
        factor: evaluation length / training length. At ``factor <= 1`` every method reduces to the model
            as trained, so the model is left as it is.
        train_len: the training length (YaRN's original context, BCA's block, temp's reference length).
    """
    if method is None:
        yield model
        return
    check_choice("extension", method, EXTENSIONS)
    if method not in model_extensions(model.cfg, [method]):
        raise LabError(
            f"extension={method!r} applies to the schemes {schemes_with(method)}; this model is "
            f"{model.cfg.encoding!r}"
            + (
                f" with layers={model.cfg.layers!r}, a per-layer plan, which takes none"
                if model.cfg.layers
                else ""
            )
        )
    original = model.encoding
    try:
        if factor > 1:
            model.use_encoding(EXTENSIONS[method](original, factor, train_len))
        yield model
    finally:
        model.use_encoding(original)
