"""The context-extension methods ``posenc extend`` compares, and what each gives a real model.

A frequency method replaces the model's rotary embedding with a :class:`posenc.RotaryEmbedding` through
:func:`posenc.hf.patch_model`, so posenc computes every position (float64 angles) and the method's
frequencies reach every layer; its factor is the longest evaluated length over the trained length N, as
an engineer extending a model to that length would set it. A training-free method keeps the model's RoPE
and remaps distances in attention (:mod:`posenc.remap`, ``patch_model(model, remap=...)``), with
parameters derived from N and the longest length (:func:`method_remap`).

A model with a per-layer plan (Gemma 3: sliding-window and global layers with their own bases), and any
method that names layers (``yarn@global``, ``pi+nope-global@every:4``: :mod:`posenc.real.layers`), runs
through ``patch_model(model, plan=...)`` instead: the method changes the RoPE of its layers only.
:func:`treatment` says which way a ``--methods`` entry runs, as a :class:`Treatment`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from posenc.extension import METHODS, MethodNames, extension_scaling
from posenc.hf import patch_model, position_plan, rope_settings, text_config, unpatch_model
from posenc.hf.layers import ADAPTERS
from posenc.real.layers import DEFAULT_LAYERS, method_plan, parse_method, plan_lines
from posenc.remap import Remap
from posenc.rope import RotaryEmbedding

__all__ = [
    "EXTEND_METHODS",
    "REMAP_METHODS",
    "Treatment",
    "applied",
    "check_applicable",
    "check_extendable",
    "method_remap",
    "method_rotary",
    "sliding_window",
    "trained_length",
    "treatment",
]

NONE_SUMMARY = "the model as trained: its config's RoPE, no extension"


class _Summaries(Mapping):
    """name -> what it does, with its source: "none" (the model as its config describes it) and every method
    of the registry (:data:`posenc.extension.METHODS`), read from it on every use, so that a method
    registered later is one of ``posenc extend``'s too."""

    def __getitem__(self, name: str) -> str:
        return NONE_SUMMARY if name == "none" else METHODS[name].summary

    def __iter__(self) -> Iterator[str]:
        return iter(("none", *METHODS))

    def __len__(self) -> int:
        return 1 + len(METHODS)


EXTEND_METHODS: Mapping[str, str] = _Summaries()
REMAP_METHODS = MethodNames(lambda m: m.kind == "remap")


def _get(config, name: str):
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def _layer_types(config) -> list:
    return list(_get(config, "layer_types") or [])


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
    not one posenc can run the methods on: it must describe RoPE, one for every layer or a per-layer plan
    (:func:`posenc.hf.position_plan`)."""
    config = text_config(config)
    if (_get(config, "model_type") or "") in ADAPTERS:
        position_plan(config)  # a ValueError naming what posenc cannot follow
        return
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
    factor 1 is no scaling for a method that is the identity there (``identity_at_one``). A layer conversion
    keeps the config's RoPE on the layers it leaves (its plan: :func:`treatment`)."""
    if method not in EXTEND_METHODS:
        raise ValueError(f"method must be one of {', '.join(EXTEND_METHODS)}; got {method!r}")
    settings = rope_settings(text_config(config))
    if method != "none" and METHODS[method].kind == "frequencies":
        train_len = trained_length(config) if train_len is None else train_len
        # A frequency method replaces the config's scaling; at a factor where its definition makes it the
        # identity it is the unscaled RoPE, built as such (so that its schedule is the plain one bit for bit)
        identity = METHODS[method].identity_at_one and factor == 1
        settings["scaling"] = None if identity else extension_scaling(method, factor, train_len)
        settings["max_position_embeddings"] = train_len  # where dynamic NTK starts to scale
    return RotaryEmbedding(**settings)


def method_remap(method: str, *, train_len: int, longest: int) -> Remap | None:
    """The remap of a training-free ``method`` for a model trained at ``train_len`` tokens run at up to
    ``longest`` (None for the frequency methods); parameters as :data:`EXTEND_METHODS` says. A ValueError
    naming ``--train-len`` where the method would remap nothing (STRING below a few tokens)."""
    if method not in REMAP_METHODS:
        return None
    return METHODS[method].remap_for(train_len, longest)


@contextlib.contextmanager
def applied(model, rotary: RotaryEmbedding, remap: Remap | None = None) -> Iterator[torch.nn.Module]:
    """``model`` with ``rotary`` computing its positions (:func:`posenc.hf.patch_model`), at ``remap``'s
    distances if given; restored after."""
    patch_model(model, rotary=rotary, remap=remap)
    try:
        yield model
    finally:
        unpatch_model(model)


@dataclass(frozen=True)
class Treatment:
    """How one ``--methods`` entry runs the model: ``rotary`` (posenc's RoPE for every layer) and ``remap``
    (training-free methods), or ``plan`` (one :class:`posenc.hf.LayerPlan` per layer)."""

    spec: str
    rotary: RotaryEmbedding | None = None
    remap: Remap | None = None
    plan: tuple | None = None

    @property
    def scaling(self) -> dict | None:
        """The scaling dict of the one RoPE, None on the plan path (each layer's is in :meth:`lines`)."""
        return None if self.rotary is None else self.rotary.scaling

    def lines(self) -> list[str]:
        """What it does, for a person and for results.json: the plan's lines, or the one RoPE and remap."""
        if self.plan is not None:
            return plan_lines(self.plan)
        return [f"every layer: {self.rotary!r}"] + (
            [f"attention remapped: {self.remap!r}"] if self.remap else []
        )

    def digest(self, length: int) -> str:
        """What decides a forward at ``length``: each layer's frequencies and attention factor there, its
        dimensions, pairing, temperature, scale and attention pattern, and the remap."""
        h = hashlib.sha256()
        ropes = [self.rotary] if self.plan is None else [lp.rope and lp.rope.module() for lp in self.plan]
        for i, rope in enumerate(ropes):
            if rope is not None:
                inv_freq, attention = rope.frequencies(length)
                h.update(inv_freq.to(torch.float64).numpy().tobytes())
                h.update(repr((float(attention), rope.rotary_dim, rope.head_dim, rope.layout)).encode())
            if self.plan is not None:
                lp = self.plan[i]
                h.update(repr((lp.layer, lp.temperature, lp.scale, lp.attention, lp.window)).encode())
        if self.remap is not None:
            h.update(repr(self.remap).encode())
        return h.hexdigest()[:16]

    @contextlib.contextmanager
    def applied(self, model) -> Iterator[torch.nn.Module]:
        """``model`` patched this way (:func:`posenc.hf.patch_model`); restored after."""
        if self.plan is not None:
            patch_model(model, plan=self.plan)
        else:
            patch_model(model, rotary=self.rotary, remap=self.remap)
        try:
            yield model
        finally:
            unpatch_model(model)


def treatment(
    config, spec: str, *, factor: float, train_len: int, longest: int, layers: str = DEFAULT_LAYERS
) -> Treatment:
    """The :class:`Treatment` of the ``--methods`` entry ``spec`` (:mod:`posenc.real.layers`) for a model with
    this transformers ``config``, extended by ``factor`` from ``train_len`` tokens, run at up to ``longest``;
    ``layers``: the layers a frequency method changes unless its entry names some. One RoPE for every layer
    (as :func:`method_rotary` and :func:`method_remap` give) where the model has one and the entry changes
    every layer; a per-layer plan otherwise. A ValueError naming the entry where it cannot run."""
    parts = parse_method(spec)
    config = text_config(config)
    planned = (_get(config, "model_type") or "") in ADAPTERS
    kind = "none" if parts[0].method == "none" else METHODS[parts[0].method].kind
    if kind == "remap" and planned:
        raise ValueError(
            f"--methods {spec}: {parts[0].method} remaps distances in attention with one RoPE; "
            f"{_get(config, 'model_type')} has a per-layer plan (its layers' RoPE differ), which remaps do "
            "not take; leave it out of --methods"
        )
    one_rope = len(parts) == 1 and parts[0].layers is None and kind in ("none", "frequencies", "remap")
    every_layer = layers == "all" or (
        layers == DEFAULT_LAYERS and "sliding_attention" not in _layer_types(config)
    )
    if not planned and one_rope and (kind != "frequencies" or every_layer):
        method = parts[0].method
        remap = method_remap(method, train_len=train_len, longest=longest)
        return Treatment(spec, method_rotary(config, method, factor=factor, train_len=train_len), remap)
    plan = method_plan(position_plan(config), parts, factor=factor, train_len=train_len, layers=layers)
    return Treatment(spec, plan=plan)
