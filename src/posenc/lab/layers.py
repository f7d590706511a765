"""Per-layer plans: a model whose layers take different positional encodings, written as one string.

A plan names a layer kind per block; a kind is any entry of the scheme registry
(:data:`posenc.lab.registry.ENCODINGS`) whose encoding touches only attention (a rotary, a bias, a
sliding window, a fixed query scale), with the options its entry declares::

    rope,rope,rope,nope          one kind per layer; a shorter list is repeated when it divides the depth
    local:16*5,rope:base=1e6     KIND(:OPTION)*(*COUNT): options NAME=VALUE, or a bare value for the
                                 kind's first option (local:16 is local:window=16); *COUNT repeats it
    every:4=nope                 every 4th layer (the 4th, 8th, ...) that kind, the others the config's
                                 encoding

``posenc train --layers PLAN`` sets :attr:`posenc.lab.config.GPTConfig.layers`; the named schemes of
:mod:`posenc.lab.layered` build theirs from the model's depth and training length. :func:`build` gives
the model's :class:`~posenc.lab.encoding.Encoding`, whose ``layers`` hold one
:class:`~posenc.lab.encoding.Layer` per block, each with its kind spelled out in full for provenance.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import posenc
from posenc.lab.encoding import Encoding, Layer
from posenc.lab.errors import LabError
from posenc.lab.registry import ModelShape, lookup

__all__ = ["build", "layered", "parse_plan", "plan_kinds", "plan_of", "rotary_dims"]

_ENTRY = re.compile(r"^(?P<body>[^*]+?)(?:\*(?P<count>\d+))?$")
_EVERY = re.compile(r"^every:(?P<n>\d+)=(?P<entry>.+)$")


def build(cfg: ModelShape) -> Encoding:
    """The :class:`Encoding` of ``cfg.encoding`` for ``cfg``, per layer when ``cfg.layers`` names a plan;
    a LabError naming the scheme when its builder returns something else (a researcher's
    ``module:function`` returning a bare module, say)."""
    enc = lookup(cfg.encoding)(cfg)
    if not isinstance(enc, Encoding):
        raise LabError(
            f"encoding={cfg.encoding!r} built a {type(enc).__name__}, not a posenc.lab.encodings.Encoding: "
            "its function must return Encoding(input=..., rotary=..., bias=...)"
        )
    plan = getattr(cfg, "layers", None)
    if plan is None:
        return enc
    if enc.layers is not None:
        raise LabError(
            f"layers={plan!r} given for encoding={cfg.encoding!r}, which has a per-layer plan of its own; "
            "give --layers with a scheme of one kind per model (rope, none, ...)"
        )
    _check_kind(cfg.encoding, enc, "layers")  # its attention would otherwise be dropped without a word
    return layered(cfg, plan, around=enc)


def plan_of(enc: Encoding) -> list[str] | None:
    """Each block's layer kind with its options as built (what provenance records), or None when every
    layer attends alike."""
    return None if enc.layers is None else [layer.kind for layer in enc.layers]


def layered(
    cfg: ModelShape, plan: str, around: Encoding | None = None, default: str | None = None
) -> Encoding:
    """An encoding whose block i attends as the i-th kind of ``plan`` (for ``cfg.n_layer`` blocks), with
    the input and positions of ``around`` (default: none, NoPE's input); ``default``: the kind of the layers
    an ``every:`` plan leaves (default ``cfg.encoding``)."""
    kinds = parse_plan(plan, cfg.n_layer, default=cfg.encoding if default is None else default)
    layers = []
    for name, options in kinds:
        enc = lookup(name)(cfg, **options)
        _check_kind(name, enc, plan)
        shown = ":".join([name, *(f"{k}={v}" for k, v in _resolved(name, options, enc).items())])
        layers.append(Layer(shown, enc))
    outer = around if around is not None else Encoding()
    return replace(outer, rotary=None, bias=None, layers=tuple(layers))


def parse_plan(plan: str, depth: int, default: str) -> list[tuple[str, dict]]:
    """``plan`` as ``depth`` pairs (kind, options), options typed as the kind's entry declares them;
    ``default`` is the kind of the layers an ``every:`` plan leaves. A LabError names what is wrong."""
    every, entries = _entries(plan)
    if every is not None:
        return [entries[0][0] if (i + 1) % every == 0 else (default, {}) for i in range(depth)]
    kinds = [kind for kind, count in entries for _ in range(count)]
    if len(kinds) > depth or depth % len(kinds):
        raise LabError(
            f"layers={plan!r} names {len(kinds)} layers for a model of n_layer={depth}: give one kind per "
            "layer, or a pattern whose length divides n_layer"
        )
    return kinds * (depth // len(kinds))


def plan_kinds(plan: str, default: str) -> list[str]:
    """The kinds ``plan`` names, each once in order (``default`` too for an ``every:`` plan), checked as
    :func:`parse_plan` checks them but for the model's depth, which is not known yet."""
    every, entries = _entries(plan)
    names = [name for (name, _), _ in entries] + ([default] if every is not None else [])
    return list(dict.fromkeys(names))


def _entries(plan: str) -> tuple[int | None, list[tuple[tuple[str, dict], int]]]:
    """``plan`` read without the model's depth: N of an ``every:N=KIND`` plan (else None) and its entries,
    each ((kind, options), count)."""
    if not isinstance(plan, str) or not plan.strip():
        raise LabError(f"layers={plan!r} must be a plan such as 'rope,rope,rope,nope' or 'every:4=nope'")
    every = _EVERY.match(plan.strip())
    if every is None:
        return None, [_entry(text, plan) for text in plan.split(",")]
    n = int(every["n"])
    if n < 1:
        raise LabError(f"layers={plan!r}: every:N needs N >= 1, got {n}")
    special = _entry(every["entry"], plan)
    if special[1] != 1:
        raise LabError(f"layers={plan!r}: every:N=KIND takes no *COUNT")
    return n, [special]


def _entry(text: str, plan: str) -> tuple[tuple[str, dict], int]:
    """One entry ``KIND(:OPTION)*(*COUNT)``: ((kind, options), count)."""
    m = _ENTRY.match(text.strip())
    if m is None or (m["count"] is not None and int(m["count"]) < 1):
        raise LabError(f"layers={plan!r}: {text.strip()!r} is not KIND(:OPTION)*(*COUNT), COUNT >= 1")
    name, *given = m["body"].split(":")
    scheme = lookup(name.strip())
    declared = list(scheme.options)
    options: dict = {}
    for i, item in enumerate(given):
        key, sep, value = item.partition("=")
        if not sep:  # a bare value is the kind's first option
            key, value = (declared[0] if declared and i == 0 else ""), item
        key = key.strip()
        if key not in scheme.options:
            raise LabError(
                f"layers={plan!r}: kind {scheme.name!r} takes no option {item!r}; allowed: "
                f"{', '.join(declared) or 'none'}"
                + (f" (a bare value sets {declared[0]})" if declared else "")
            )
        try:
            options[key] = scheme.options[key](value.strip())
        except ValueError:
            kind = scheme.options[key].__name__
            article = "an" if kind[0] in "aeiou" else "a"
            raise LabError(
                f"layers={plan!r}: {scheme.name}'s {key}={value!r} is not {article} {kind}"
            ) from None
    return (scheme.name, options), int(m["count"] or 1)


def _check_kind(name: str, enc: Encoding, plan: str) -> None:
    """Refuse a kind whose encoding does more than attention: a block can take its attention from the plan,
    not an input encoding, positions of its own or parameters the model holds per layer."""
    why = None
    if not isinstance(enc.input, posenc.NoPositionalEncoding):
        why = "it adds positions to the input, which is shared by every layer"
    elif enc.random_positions is not None or enc.train_positions is not None:
        why = "it draws positions of its own"
    elif enc.sinks or enc.layer_bias is not None or enc.hidden_terms is not None:
        why = "it holds parameters per layer (sinks, a bias per layer, hidden-state terms)"
    elif enc.query_scale is not None and enc.query_scale.learned:
        why = "its query scale is learned per layer"
    elif enc.window is not None or enc.layers is not None:
        why = "it has a blockwise window or a plan of its own"
    if why is not None:
        raise LabError(f"layers={plan!r}: {name!r} cannot be one layer's kind: {why}")


def _resolved(name: str, options: dict, enc: Encoding) -> dict:
    """The options of a layer as built, defaults included and in the entry's order, so that a recorded
    plan says what ran (partial RoPE's fraction as rotated, after rounding to whole pairs)."""
    built: dict = {"window": enc.sliding}
    if enc.rotary is not None:
        built["base"] = float(enc.rotary.base)
        built["frac"] = round(enc.rotary.rotary_dim / enc.rotary.head_dim, 4)
    shown = {k: built[k] if built.get(k) is not None else options.get(k) for k in lookup(name).options}
    return {k: v for k, v in shown.items() if v is not None}


def rotary_dims(head_dim: int, frac: float) -> int:
    """The dimensions partial RoPE rotates of ``head_dim``: ``frac`` of them rounded to whole pairs, at
    least one pair (a fraction that would rotate none is not RoPE)."""
    if not (isinstance(frac, (int, float)) and 0 < frac <= 1) or isinstance(frac, bool):
        raise LabError(f"frac={frac!r} must be a fraction of the head's dimensions in (0, 1]")
    return max(2, 2 * math.floor(frac * head_dim / 2 + 0.5))
