"""Which layers a method changes: layer sets, method specs with per-layer parts, and the plan they give.

A model's :func:`~posenc.hf.position_plan` says what each layer does with positions. A context-extension
method (:data:`posenc.extension.METHODS`) changes the RoPE of a set of layers:

- ``global``: the full-attention layers (every layer of a model without sliding windows); ``sliding``: the
  sliding-window layers; ``all``: every layer with RoPE; ``every:K``: layers K-1, 2K-1, ... (SmolLM3 drops
  RoPE on every 4th); ``i,j,k`` (``i/j/k`` inside a method spec): those layers, counted from 0.
- By default a frequency method changes the layers the family's own long-context configuration scales: the
  global layers (Gemma 3's larger models scale their global layers only, linear x8; a model without
  sliding layers has only global ones). A layer conversion (``nope-global``) names its own set.

A method spec is ``method[@set]`` or several joined by ``+``, each on its own layers, e.g.
``yarn@global``, ``yarn@all``, ``pi+nope-global@every:4``: a per-layer mix. Sets may not overlap. A remap
(SelfExtend, ReRoPE, ...) acts in every layer's attention and mixes with nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from posenc.extension import METHODS, extension_scaling
from posenc.hf import LayerPlan

__all__ = [
    "LAYER_SETS",
    "LogLengthTemperature",
    "DEFAULT_LAYERS",
    "Part",
    "layer_indices",
    "method_plan",
    "parse_method",
    "plan_lines",
]

LAYER_SETS = "global, sliding, all, every:K or layer indices i,j,k"
DEFAULT_LAYERS = "global"  # what a frequency method changes unless told (module docstring)


@dataclass(frozen=True)
class LogLengthTemperature:
    """The query scale max(1, ln(p + 1) / ln N) at position p of a model trained at N tokens: 1 inside the
    trained length, growing with the log of the length past it, so that attention's entropy does not grow
    with the number of keys (Chiang & Cholak 2022, arXiv:2202.12172; SWAN-GPT's scaling of NoPE layers,
    Puvvada et al. 2025, arXiv:2504.08719). Called as a :class:`posenc.hf.LayerPlan` temperature."""

    train_len: int

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """s(p) for positions (..., seq), float32, computed in float64."""
        p = positions.to(torch.float64)
        return torch.clamp(torch.log1p(p) / math.log(self.train_len), min=1.0).float()

    def __repr__(self) -> str:
        return f"max(1,ln(p+1)/ln {self.train_len})"


@dataclass(frozen=True)
class Part:
    """One part of a method spec: a method name (``none`` or a key of :data:`posenc.extension.METHODS`) and
    the layer set it applies to (None: its default)."""

    method: str
    layers: str | None = None

    def __str__(self) -> str:
        return self.method + (f"@{self.layers.replace(',', '/')}" if self.layers else "")


def parse_method(spec: str) -> tuple[Part, ...]:
    """The parts of a ``--methods`` entry (module docstring); a ValueError naming the entry, the unknown
    method or the misplaced remap."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--methods entry {spec!r} is empty")
    parts = []
    for text in spec.split("+"):
        method, _, layers = text.partition("@")
        if method != "none" and method not in METHODS:
            raise ValueError(
                f"--methods {spec}: unknown method {method!r}; choose from none, {', '.join(METHODS)}"
            )
        if "@" in text and not layers:
            raise ValueError(f"--methods {spec}: '@' needs a layer set after it ({LAYER_SETS})")
        parts.append(Part(method, layers.replace("/", ",") or None))
    remaps = [p for p in parts if p.method != "none" and METHODS[p.method].kind == "remap"]
    if remaps and (len(parts) > 1 or parts[0].layers not in (None, "all")):
        raise ValueError(
            f"--methods {spec}: {remaps[0].method} remaps distances in every layer's attention; it takes no "
            "layer set and mixes with no other method"
        )
    return tuple(parts)


def _rope_layers(plan) -> list[int]:
    return [lp.layer for lp in plan if lp.rope is not None]


def layer_indices(layer_set: str, plan, *, flag: str = "--layers") -> tuple[int, ...]:
    """The layers of ``plan`` (a model's per-layer plan) that ``layer_set`` names, each with RoPE; a
    ValueError naming ``flag``, the set and what the model has when it is malformed or names none."""
    n, text = len(plan), str(layer_set).strip()
    if text == "global":
        chosen = [lp.layer for lp in plan if lp.attention == "full"]
    elif text == "sliding":
        chosen = [lp.layer for lp in plan if lp.attention == "sliding"]
    elif text == "all":
        chosen = _rope_layers(plan)
    elif text.startswith("every:"):
        k = text[len("every:") :]
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"{flag} {text}: every:K needs a positive integer K, got {k!r}")
        chosen = [i for i in range(int(k) - 1, n, int(k))]
    else:
        chosen = _indices(text, n, flag)
    with_rope = set(_rope_layers(plan))
    chosen = [i for i in chosen if i in with_rope]
    if not chosen:
        raise ValueError(
            f"{flag} {text} names no layer with RoPE in this model ({n} layers: {_summary(plan)}); "
            f"allowed: {LAYER_SETS}"
        )
    return tuple(sorted(chosen))


def _indices(text: str, n: int, flag: str) -> list[int]:
    items = text.split(",")
    if not all(i.strip().isdigit() for i in items):
        raise ValueError(f"{flag} {text} is not a layer set; allowed: {LAYER_SETS}")
    chosen = [int(i) for i in items]
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"{flag} {text} names a layer twice")
    outside = [i for i in chosen if i >= n]
    if outside:
        raise ValueError(f"{flag} {text}: this model has layers 0..{n - 1}, not {outside[0]}")
    return chosen


def _summary(plan) -> str:
    kinds = {}
    for lp in plan:
        kinds.setdefault(lp.attention, []).append(lp.layer)
    return "; ".join(f"{kind} {','.join(map(str, layers))}" for kind, layers in kinds.items())


def method_plan(plan, parts: tuple[Part, ...], *, factor: float, train_len: int, layers: str):
    """``plan`` (the model's own, one :class:`~posenc.hf.LayerPlan` per layer) with each part of a method
    spec applied to its layers (``layers``: the default set of a part that names none and whose method has
    no default of its own). A ValueError naming the spec where sets overlap or name no RoPE layer."""
    spec = "+".join(map(str, parts))
    owner: dict[int, str] = {}
    for part in parts:
        if part.method == "none":
            continue
        layer_set = part.layers or METHODS[part.method].layers or layers
        for i in layer_indices(layer_set, plan, flag=f"--methods {spec}: layer set"):
            if i in owner:
                raise ValueError(
                    f"--methods {spec}: layer {i} is in both {owner[i]}'s and {part.method}'s layers; each "
                    "layer takes one method"
                )
            owner[i] = part.method
    return tuple(
        _converted(lp, METHODS[owner[lp.layer]], factor, train_len) if lp.layer in owner else lp
        for lp in plan
    )


def _converted(lp: LayerPlan, method, factor: float, train_len: int) -> LayerPlan:
    """Layer ``lp`` under ``method``: without RoPE (and with the log-length temperature) for a layer
    conversion; with the method's scaling replacing the layer's for a frequency method (none at factor 1
    for a method that is the identity there, so that its schedule is the plain one bit for bit)."""
    if method.without_rope:
        temperature = LogLengthTemperature(train_len) if method.query_temperature else None
        return dataclasses.replace(lp, rope=None, temperature=temperature)
    identity = method.identity_at_one and factor == 1
    scaling = () if identity else tuple(sorted(extension_scaling(method.name, factor, train_len).items()))
    rope = dataclasses.replace(lp.rope, scaling=scaling, max_position_embeddings=train_len)
    rope.module()  # refused now, with the module's own message, if the scaling cannot be built
    return dataclasses.replace(lp, rope=rope)


def plan_lines(plan) -> list[str]:
    """The plan as lines for a person: consecutive layers that do the same thing on one line."""
    lines, start = [], 0
    for i in range(1, len(plan) + 1):
        if i == len(plan) or _what(plan[i]) != _what(plan[start]):
            span = f"layer {start}" if i - 1 == start else f"layers {start}-{i - 1}"
            lines.append(f"{span}: {_what(plan[start])}")
            start = i
    return lines


def _what(lp: LayerPlan) -> str:
    return repr(lp).split(": ", 1)[1]
