"""The positional encodings the laboratory trains with, by name, and RoPE's eval-time extensions.

Every scheme comes from the core (:mod:`posenc`) through a registry, so adding one is one decorated
function returning the modules the model needs:

    @register_encoding("mine")
    def _mine(cfg: GPTConfig) -> Encoding:
        return Encoding(input=..., rotary=..., bias=...)

A researcher's own scheme needs no edit here: ``--schemes package.module:function`` (or
``path/to/file.py:function``) imports ``function(cfg) -> Encoding`` on first use (:func:`lookup`).

This module imports nothing of the laboratory but its errors, so :mod:`posenc.lab.config` can check an
encoding name against :data:`ENCODINGS` without an import cycle.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from torch import nn

import posenc
from posenc.lab.errors import LabError


class GPTConfig(Protocol):
    """What a scheme's builder reads of a model's config (:class:`posenc.lab.config.GPTConfig`, which this
    module does not import: config imports this one to check encoding names)."""

    encoding: str
    n_head: int
    d_model: int
    max_len: int
    rope_base: float

    @property
    def head_dim(self) -> int: ...


@dataclass
class Encoding:
    """The positional machinery of one scheme.

    input: adds position to the embeddings, ``(B, T, D), offset -> (B, T, D)``.
    rotary: rotates q and k in every layer (RoPE, xPos), or None.
    bias: the attention bias passed to :func:`posenc.attention` in every layer (ALiBi, T5, KERPLE, ...), or
        None.
    layer_bias: for schemes with parameters of their own in each layer (Shaw et al., CoPE): a function
        called once per layer that returns that layer's bias module; used instead of ``bias``.
    random_positions: randomized positions (Ruoss et al. 2023, arxiv.org/abs/2305.16843): each forward pass
        places its T tokens at a sorted random sample of T distinct positions from 0 .. n-1 (n = this
        value, or T when T is larger), instead of 0 .. T-1. The encodings (``input``'s and ``rotary``'s)
        must take positions. None: ordinary positions.
    """

    input: nn.Module = field(default_factory=posenc.NoPositionalEncoding)
    rotary: posenc.RotaryEmbedding | None = None
    bias: nn.Module | None = None
    layer_bias: Callable[[], nn.Module] | None = None
    random_positions: int | None = None


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
    return Encoding(rotary=posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base))


@register_encoding("alibi")
def _alibi(cfg: GPTConfig) -> Encoding:
    return Encoding(bias=posenc.ALiBi(cfg.n_head))


@register_encoding("t5")
def _t5(cfg: GPTConfig) -> Encoding:
    # Raffel et al. 2020: a learned bias per (bucketed) relative distance and head
    return Encoding(bias=posenc.T5Bias(cfg.n_head))


@register_encoding("kerple")
def _kerple(cfg: GPTConfig) -> Encoding:
    # Chi et al. 2022, the logarithmic kernel (their best extrapolating variant)
    return Encoding(bias=posenc.KerpleBias(cfg.n_head, kind="log"))


@register_encoding("sandwich")
def _sandwich(cfg: GPTConfig) -> Encoding:
    # Chi et al. 2023: parameter-free, from the sinusoidal inner product
    return Encoding(bias=posenc.SandwichBias(cfg.n_head))


@register_encoding("fire")
def _fire(cfg: GPTConfig) -> Encoding:
    # Li et al. 2023; its threshold starts at the training length (see posenc.FireBias)
    return Encoding(bias=posenc.FireBias(cfg.n_head, train_len=cfg.max_len))


@register_encoding("xpos")
def _xpos(cfg: GPTConfig) -> Encoding:
    # Sun et al. 2022: RoPE with a per-pair decay; evaluated past the training length with blockwise causal
    # attention (the "bca" extension), as in the paper
    return Encoding(rotary=posenc.XPos(cfg.head_dim, base=cfg.rope_base))


@register_encoding("shaw")
def _shaw(cfg: GPTConfig) -> Encoding:
    # Shaw et al. 2018: learned key and value vectors per clipped distance (k = 16, the paper's), one pair of
    # tables per layer shared by its heads
    return Encoding(layer_bias=lambda: posenc.ShawRelative(cfg.head_dim, max_distance=16))


@register_encoding("cope")
def _cope(cfg: GPTConfig) -> Encoding:
    # Golovneva et al. 2024: positions counted by gates on the query-key scores; one position table per layer
    # with the training length + 1 entries, as their code (a count runs from 0 to the keys a query sees)
    return Encoding(layer_bias=lambda: posenc.CoPE(cfg.head_dim, npos_max=cfg.max_len + 1))


# Randomized positions (Ruoss et al. 2023) sample from a range as long as the longest evaluation of the quick
# preset (16 x the training length), so that every position seen at evaluation was seen in training.
RANDOM_RANGE_MULTIPLE = 16


@register_encoding("rope-random")
def _rope_random(cfg: GPTConfig) -> Encoding:
    return Encoding(
        rotary=posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base),
        random_positions=RANDOM_RANGE_MULTIPLE * cfg.max_len,
    )


@register_encoding("sinusoidal-random")
def _sinusoidal_random(cfg: GPTConfig) -> Encoding:
    return Encoding(
        input=posenc.SinusoidalEncoding(cfg.d_model), random_positions=RANDOM_RANGE_MULTIPLE * cfg.max_len
    )


BUILTIN = tuple(ENCODINGS)  # the schemes above, in the order `--schemes all` runs them

# The built-ins that pair dimensions, checked by GPTConfig before a model is built: rotations pair the
# dimensions of a head, the sinusoidal table those of d_model.
EVEN_HEAD_DIM = ("rope", "xpos", "rope-random")
EVEN_D_MODEL = ("sinusoidal", "sinusoidal-random")


def registered_names() -> list[str]:
    """The names registered with :func:`register_encoding`, sorted (not the imported user specs)."""
    return sorted(n for n in ENCODINGS if ":" not in n)


def lookup(name: str) -> Callable[[GPTConfig], Encoding]:
    """The builder registered as ``name``. A ``"package.module:function"`` or ``"path/file.py:function"``
    spec is imported and registered under that spec on first use, in every process that asks (compare's
    workers included), so a researcher's scheme runs like the built-ins without editing posenc."""
    if name in ENCODINGS:
        return ENCODINGS[name]
    if not isinstance(name, str) or ":" not in name:
        raise LabError(
            f"encoding={name!r} is not known; allowed: {', '.join(registered_names())}, "
            "or your own as 'package.module:function' / 'path/to/file.py:function'"
        )
    where, _, attr = name.rpartition(":")
    try:
        module = _import(where)
    except (ImportError, OSError, SyntaxError) as err:
        raise LabError(f"encoding={name!r}: cannot import {where!r}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise LabError(f"encoding={name!r}: {where!r} has no function {attr!r} (fn(cfg) -> Encoding)")
    ENCODINGS[name] = fn
    return fn


def build(cfg: GPTConfig) -> Encoding:
    """The :class:`Encoding` of ``cfg.encoding`` for ``cfg``; a LabError naming the scheme when its builder
    returns something else (a researcher's ``module:function`` returning a bare module, say)."""
    enc = lookup(cfg.encoding)(cfg)
    if not isinstance(enc, Encoding):
        raise LabError(
            f"encoding={cfg.encoding!r} built a {type(enc).__name__}, not a posenc.lab.encodings.Encoding: "
            "its function must return Encoding(input=..., rotary=..., bias=...)"
        )
    return enc


def _import(where: str):
    if not where.endswith(".py"):
        return importlib.import_module(where)
    path = Path(where).resolve()
    spec = importlib.util.spec_from_file_location(f"posenc_user_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ImportError(f"no Python file at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# RoPE eval-time context extensions (posenc.rope.frequencies.EXTENSION_METHODS): pi, position
# interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595); ntk, NTK-aware base scaling (bloc97 2023);
# dynamic, dynamic NTK (emozilla 2023); yarn, YaRN (Peng et al. 2023, arxiv.org/abs/2309.00071).
ROPE_EXTENSIONS: tuple[str, ...] = ("pi", "ntk", "dynamic", "yarn")

# Every eval-time extension -> the schemes it applies to. Besides RoPE's:
# bca: blockwise causal attention, each query sees its own block of half the training length and the previous
#   one
#   (Sun et al. 2022, arxiv.org/abs/2212.10554, section 3.3: how xPos is evaluated past its training length);
# temp: NoPE with a sharper softmax past the training length, scores times log(n) / log(L) at length n and
#   training length L (Wang et al. 2024, arxiv.org/abs/2404.12224, who find NoPE's attention spreads out
#   past L and tune one temperature; log-length scaling is Chiang & Cholak 2022, arxiv.org/abs/2202.12172).
EXTENSIONS: dict[str, tuple[str, ...]] = {
    **{method: ("rope",) for method in ROPE_EXTENSIONS},
    "bca": ("xpos",),
    "temp": ("none",),
}


def extensions_for(scheme: str, requested) -> list[str]:
    """The extensions among ``requested`` (names of :data:`EXTENSIONS`) that apply to ``scheme``."""
    return [m for m in requested if scheme in EXTENSIONS.get(m, ())]
