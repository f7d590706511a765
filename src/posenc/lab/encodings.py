"""The laboratory's positional encodings: one registry entry per scheme, owning every fact about it.

A :class:`Scheme` is a name, a builder ``build(cfg) -> Encoding``, the names of the eval-time extensions
that apply to it (functions of :mod:`posenc.lab.extensions`) and the size it pairs dimensions of, if any.
Adding a scheme is one decorated function:

    @register_encoding("mine", extensions=("temp",))
    def _mine(cfg: ModelShape) -> Encoding:
        return Encoding(input=..., rotary=..., bias=...)

A researcher's own scheme needs no edit here: ``--schemes package.module:function`` (or
``path/to/file.py:function``) imports ``function(cfg) -> Encoding`` on first use (:func:`lookup`).

An :class:`~posenc.lab.encoding.Encoding` is everything the model reads about positions: an input
encoding, a rotary, a score bias (shared or one per layer), randomized positions, attention sinks, a query
scale per row (SSMax's s log n, :class:`~posenc.lab.encoding.QueryScale`), and two modifiers that
extensions set and that combine with the rest: an attention window (blockwise causal attention) and a
score scale. :func:`eval_extension` applies one of a scheme's extensions to a model for a block.

This module imports nothing of the laboratory above :mod:`posenc.lab.extensions`, so
:mod:`posenc.lab.config` can check an encoding name against :data:`ENCODINGS` without an import cycle.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

import posenc
from posenc.extension import MethodNames
from posenc.lab.checks import check_choice
from posenc.lab.encoding import Encoding, KeyTerm, QueryScale, QueryTerm, floored_log_length
from posenc.lab.errors import LabError
from posenc.lab.extensions import EXTENSIONS, ROPE_EXTENSIONS
from posenc.lab.recipes import RECIPES, pose_positions


class ModelShape(Protocol):
    """What a scheme's builder reads of the :class:`posenc.lab.config.GPTConfig` it gets (which this module
    does not import: config imports this one to check encoding names): the encoding's name and the shape."""

    encoding: str
    n_head: int
    d_model: int
    max_len: int
    rope_base: float

    @property
    def head_dim(self) -> int: ...


@dataclass(frozen=True)
class Scheme:
    """One registry entry: everything the laboratory knows about a positional scheme.

    name: what ``--schemes`` and ``GPTConfig.encoding`` call it.
    build: ``build(cfg) -> Encoding``.
    extensions: the eval-time extensions (names of :data:`posenc.lab.extensions.EXTENSIONS`) that apply.
    pairs: the size the scheme pairs dimensions of, which must then be even: "head_dim" (rotations pair
        the dimensions of a head), "d_model" (the sinusoidal table those of the model), or None.
    recipes: the extensions by training (:data:`posenc.lab.recipes.RECIPES`) that apply; a scheme with
        recipes reads ``cfg.rope_scaling`` and ``cfg.pose_len``.
    """

    name: str
    build: Callable[[ModelShape], Encoding]
    extensions: Sequence[str] = ()
    pairs: str | None = None
    recipes: tuple[str, ...] = ()

    def __call__(self, cfg: ModelShape) -> Encoding:
        return self.build(cfg)

    def check(self, cfg: ModelShape) -> None:
        """Refuse a config whose paired size is odd, naming the scheme and the sizes."""
        if self.pairs == "head_dim" and cfg.head_dim % 2:
            raise LabError(
                f"encoding={self.name!r} needs an even head size: d_model={cfg.d_model} / "
                f"n_head={cfg.n_head} = {cfg.head_dim} (rotary encodings rotate pairs of dimensions within "
                f"each head)"
            )
        if self.pairs == "d_model" and cfg.d_model % 2:
            raise LabError(
                f"encoding={self.name!r} needs an even d_model, got {cfg.d_model} (each frequency fills "
                f"a sin and a cos dimension)"
            )
        changed = [k for k in ("rope_scaling", "pose_len") if getattr(cfg, k, None) is not None]
        if changed and not self.recipes:
            raise LabError(
                f"{', '.join(changed)} set for encoding={self.name!r}, which takes no extension recipe "
                f"(those with recipes: {', '.join(n for n, s in ENCODINGS.items() if s.recipes)})"
            )


ENCODINGS: dict[str, Scheme] = {}


def register_encoding(
    name: str, *, extensions: tuple[str, ...] = (), pairs: str | None = None, recipes: tuple[str, ...] = ()
):
    """Decorator adding ``fn(cfg) -> Encoding`` to the registry as the :class:`Scheme` ``name``."""
    if pairs not in (None, "head_dim", "d_model"):
        raise LabError(f"pairs={pairs!r} is not known; allowed: None, 'head_dim', 'd_model'")
    unknown = [e for e in extensions if e not in EXTENSIONS]
    if unknown:
        raise LabError(
            f"extensions={list(extensions)!r}: unknown {unknown}; allowed: {', '.join(EXTENSIONS)}"
        )

    kept = extensions if isinstance(extensions, MethodNames) else tuple(extensions)  # a view stays live

    def wrap(fn):
        ENCODINGS[name] = Scheme(name, fn, kept, pairs, tuple(recipes))
        return fn

    return wrap


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


@register_encoding("rope", extensions=ROPE_EXTENSIONS, pairs="head_dim", recipes=tuple(RECIPES))
def _rope(cfg: ModelShape) -> Encoding:
    # a recipe's model (posenc.lab.recipes): scaled past the training length, PoSE's positions in training
    scaling = getattr(cfg, "rope_scaling", None)
    rotary = posenc.RotaryEmbedding(
        cfg.head_dim,
        base=cfg.rope_base,
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


BUILTIN = tuple(ENCODINGS)  # the schemes above, in the order `--schemes all` runs them


def registered_names() -> list[str]:
    """The names registered with :func:`register_encoding`, sorted (not the imported user specs)."""
    return sorted(n for n in ENCODINGS if ":" not in n)


def lookup(name: str) -> Scheme:
    """The scheme registered as ``name``. A ``"package.module:function"`` or ``"path/file.py:function"``
    spec is imported and registered under that spec on first use, in every process that asks (compare's
    workers included), so a researcher's scheme runs like the built-ins without editing posenc; it has no
    eval-time extensions and no dimension rule."""
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
    ENCODINGS[name] = fn if isinstance(fn, Scheme) else Scheme(name, fn)
    return ENCODINGS[name]


def build(cfg: ModelShape) -> Encoding:
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


def extensions_for(scheme: str, requested) -> list[str]:
    """The extensions among ``requested`` that apply to ``scheme`` (its entry's ``extensions``)."""
    own = ENCODINGS[scheme].extensions if scheme in ENCODINGS else ()
    return [m for m in requested if m in own]


def schemes_with(extension: str) -> list[str]:
    """The registered schemes that ``extension`` applies to, in registration order."""
    return [name for name, scheme in ENCODINGS.items() if extension in scheme.extensions]


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
    if method not in lookup(model.cfg.encoding).extensions:
        raise LabError(
            f"extension={method!r} applies to the schemes {schemes_with(method)}; this model is "
            f"{model.cfg.encoding!r}"
        )
    original = model.encoding
    try:
        if factor > 1:
            model.use_encoding(EXTENSIONS[method](original, factor, train_len))
        yield model
    finally:
        model.use_encoding(original)
