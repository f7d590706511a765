"""Schemes whose layers keep positions differently, and the layer kinds only a per-layer plan needs.

Layer kinds (each usable in ``--layers``, :mod:`posenc.lab.layers`; ``rope:base=B:frac=F`` and ``none``
are :mod:`posenc.lab.encodings`'):

- ``nope``: no position term (NoPE, Haviv et al. 2022), ``nope:scale=log`` with the log-length query scale
  :func:`log_length_scale` (SWAN-GPT's dynamic scaling of its NoPE layers).
- ``local``: RoPE under sliding-window attention (``local:W:base=B``; Beltagy et al. 2020; Gemma 3's local
  layers), default window :func:`local_window` and the config's base.

Named schemes (``posenc compare --schemes swan,...``), each a plan from the model's depth and training
length L, recorded per layer in the run's provenance:

- ``swan``: SWAN-GPT (Puvvada et al. 2025, arxiv.org/abs/2504.08719): global NoPE layers with the log-length
  scale, one in four, the others sliding-window RoPE; the last layer global when the model has fewer than
  four.
- ``gemma-local-global``: Gemma 3 (Gemma Team 2025, arxiv.org/abs/2503.19786): five local sliding-window
  layers at base 1e4 per global layer at base 1e6, the last layer global when the model has fewer than six.
- ``smollm3``: SmolLM3 (Hugging Face 2025): RoPE, but NoPE on every fourth layer.
- ``p-rope``: RoPE on a tenth of each head's dimensions (at least one pair), the rest free of position
  (partial RoPE, arxiv.org/abs/2603.11611).
- ``rope-below-bound`` / ``rope-above-bound``: RoPE at half and twice Men et al.'s lower bound on the base
  for a context of L (arxiv.org/abs/2405.14591, :func:`base_bound`), which predicts retrieval failing below
  it while perplexity stays fine.

Ad hoc plans run as schemes too: ``plan:PLAN`` is the per-layer plan PLAN (the syntax of ``--layers``,
with ``/`` between layers, since a comma separates ``--schemes``), NoPE's input, and RoPE on the layers an
``every:N=KIND`` plan leaves: ``posenc compare --schemes rope,plan:rope/rope/rope/nope,plan:every:2=nope``.
"""

from __future__ import annotations

import functools
import math

import posenc
from posenc.lab.checks import check_choice
from posenc.lab.encoding import Encoding, QueryScale, floored_log_length
from posenc.lab.errors import LabError
from posenc.lab.layers import layered, plan_kinds
from posenc.lab.registry import SPELLED, ModelShape, Scheme, lookup, register_encoding

__all__ = ["BOUND_FACTOR", "PLAN_PREFIX", "base_bound", "local_window", "log_length_scale", "plan_scheme"]

PLAN_PREFIX = "plan:"
# the kind of the layers an ad hoc every:N=KIND plan leaves (a plan scheme has no encoding of its own)
_PLAN_DEFAULT = "rope"

# how far below and above the bound the two bound schemes sit: far enough to be on either side of a bound
# fitted with scatter, near enough that the base stays above 1 at the tiny preset's L = 16
BOUND_FACTOR = 2.0


def log_length_scale(cfg: ModelShape) -> QueryScale:
    """The log-length query scale: 1 for a row that sees up to L keys (L the training length), then
    log(n) / log(L) (``floored_log_length`` with alpha = 1 / log L): SWAN-GPT's dynamic attention scaling
    for its NoPE layers, a row as sharp at n keys past L as at L. Fixed, not learned."""
    if cfg.max_len < 2:
        raise LabError(
            f"the log-length scale divides by log(max_len): it needs max_len >= 2, got {cfg.max_len}"
        )
    length = functools.partial(floored_log_length, floor=cfg.max_len, alpha=1.0 / math.log(cfg.max_len))
    return QueryScale(length=length, init=1.0, learned=False)


def local_window(cfg: ModelShape) -> int:
    """The lab's default sliding window: a quarter of the training length (at least 1 key), so that a local
    layer sees less than a global one inside L, as Gemma's 1024 of 32K and SWAN's window of its context."""
    return max(1, cfg.max_len // 4)


def base_bound(train_len: int) -> float:
    """Men et al.'s lower bound on the RoPE base for a context of ``train_len`` tokens, 0.0424 L^1.628
    (arxiv.org/abs/2405.14591, their fit of the base that keeps long-range retrieval)."""
    return 0.0424 * train_len**1.628


@register_encoding("nope", options={"scale": str})
def _nope(cfg: ModelShape, scale: str | None = None) -> Encoding:
    if scale is not None:
        check_choice("nope scale", scale, ("log",))
    return Encoding(query_scale=None if scale is None else log_length_scale(cfg))


@register_encoding("local", pairs="head_dim", options={"window": int, "base": float})
def _local(cfg: ModelShape, window: int | None = None, base: float | None = None) -> Encoding:
    window = local_window(cfg) if window is None else window
    if window < 1:
        raise LabError(f"local window={window} must be >= 1 (the keys a query sees, itself included)")
    rotary = posenc.RotaryEmbedding(cfg.head_dim, base=cfg.rope_base if base is None else base)
    return Encoding(rotary=rotary, sliding=window)


def _pattern(depth: int, every: int, special: str, other: str, keep_one: bool) -> str:
    """A plan of ``depth`` layers: every ``every``-th ``special``, the rest ``other``; with ``keep_one`` the
    last layer ``special`` when the model is too shallow for one (a scheme's only global layer)."""
    kinds = [special if (i + 1) % every == 0 else other for i in range(depth)]
    if keep_one and special not in kinds:
        kinds[-1] = special
    return ",".join(kinds)


@register_encoding("swan", pairs="head_dim")
def _swan(cfg: ModelShape) -> Encoding:
    return layered(cfg, _pattern(cfg.n_layer, 4, "nope:scale=log", "local", keep_one=True))


@register_encoding("gemma-local-global", pairs="head_dim")
def _gemma(cfg: ModelShape) -> Encoding:
    return layered(cfg, _pattern(cfg.n_layer, 6, "rope:base=1e6", "local:base=1e4", keep_one=True))


@register_encoding("smollm3", pairs="head_dim")
def _smollm3(cfg: ModelShape) -> Encoding:
    return layered(cfg, _pattern(cfg.n_layer, 4, "nope", "rope", keep_one=False))


@register_encoding("p-rope", pairs="head_dim")
def _p_rope(cfg: ModelShape) -> Encoding:
    return layered(cfg, "rope:frac=0.1")


def _bound_rope(cfg: ModelShape, factor: float) -> Encoding:
    base = base_bound(cfg.max_len) * factor
    if base <= 1:
        raise LabError(
            f"RoPE at {factor} x Men et al.'s bound for max_len={cfg.max_len} has base {base:.3g} <= 1 (no "
            "decreasing frequencies): use a longer training length"
        )
    return layered(cfg, f"rope:base={base!r}")


@register_encoding("rope-below-bound", pairs="head_dim")
def _rope_below(cfg: ModelShape) -> Encoding:
    return _bound_rope(cfg, 1 / BOUND_FACTOR)


@register_encoding("rope-above-bound", pairs="head_dim")
def _rope_above(cfg: ModelShape) -> Encoding:
    return _bound_rope(cfg, BOUND_FACTOR)


def plan_scheme(name: str) -> Scheme:
    """The scheme ``plan:PLAN`` (module docstring), its entries checked now; a LabError names ``schemes``,
    the item and what is wrong. Its depth is checked when a model is built."""
    plan = name[len(PLAN_PREFIX) :].replace("/", ",")
    try:
        kinds = plan_kinds(plan, _PLAN_DEFAULT)
    except LabError as err:
        raise LabError(f"schemes item {name!r}: {err}") from None

    def build(cfg: ModelShape) -> Encoding:
        try:
            return layered(cfg, plan, default=_PLAN_DEFAULT)
        except LabError as err:
            raise LabError(f"schemes item {name!r}: {err}") from None

    pairs = "head_dim" if any(lookup(k).pairs == "head_dim" for k in kinds) else None
    return Scheme(name, build, pairs=pairs)


SPELLED[PLAN_PREFIX] = plan_scheme
