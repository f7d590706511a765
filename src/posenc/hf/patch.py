"""Running a transformers model with posenc computing its positions: :func:`patch_model`, which dispatches
to the path a model takes (its per-layer plan, its rotary modules' hand-outs, or a remap in its attention),
and :func:`unpatch_model`. The hand-out machinery is :mod:`posenc.hf.handout`."""

from __future__ import annotations

import contextlib
import types

from ..remap import NoRemap, Remap
from ..rope import RotaryEmbedding
from ._config import config_value, rope_settings, temperature_keys
from .families import Attention
from .handout import (
    check_plain,
    device_of,
    handout_form,
    keeps_float32,
    own_rotary,
    places_image_patches,
    plan_typed,
    rope_layer_types,
    typed_forward,
)
from .layers import ADAPTERS, PLANNED_FORMS, patch_layers
from .ledger import is_patched, ledger, undo
from .plan import position_plan, text_config
from .remap import patch_remap
from .replica import check_replica
from .window import patch_windows

__all__ = ["patch_model", "unpatch_model"]


def patch_model(model, rotary: RotaryEmbedding | None = None, plan=None, remap=None):
    """Make a transformers model take its positions from posenc. Returns the model.

    For the families with per-layer plans (Llama 4, Gemma 3, Gemma 4, Cohere2, SmolLM3, DeepSeek V3,
    Qwen2-VL, Qwen2.5-VL, Qwen3-VL; :data:`posenc.hf.layers.ADAPTERS`), every attention layer gets the
    positions of its :class:`~posenc.hf.plan.LayerPlan` (``plan``, default :func:`position_plan` of the
    model's config): posenc's cos/sin (identity on NoPE layers), softmax scale and query temperature
    (:mod:`posenc.hf.layers`). A ``plan`` differing from the config's is applied as far as the model's
    attention code allows, and refused (ValueError) beyond that. Sliding-window layers run on posenc's
    windowed kernel, O(L x window) memory where transformers would build an L x L mask
    (:mod:`posenc.hf.window`).

    For every other family, each ``*RotaryEmbedding`` submodule gets a posenc :class:`RotaryEmbedding`
    (built from its config by :func:`rotary_from_config`, or ``rotary``), stored as its ``posenc_rotary``
    child, and a forward that returns posenc's cos/sin in the shape and order that family's attention code
    expects; a module with one RoPE per layer type (OLMo 3, ModernBERT, LFM3, ...) gets one per type. Each
    is checked against the module's own cos/sin before anything is patched, and refused (ValueError) unless
    equal to float32 rounding. A vision tower's rotary module (``rope_type`` "axial", the positions of image
    patches) is left as it is: posenc computes the language model's positions.

    With ``remap`` (a :class:`posenc.remap.Remap`: SelfExtend, ReRoPE, STRING), the model's attention runs
    at remapped distances with that RoPE (single-RoPE rotate_half families, unpadded batches; see
    :mod:`posenc.hf.remap`): prefill and ``generate`` alike.

    Logits match the unpatched model to float32 rounding (tests/test_hf.py, tests/hf/); the angles are
    formed in float64, so at positions past ~10^5 posenc's are the accurate ones. Length-dependent methods
    use 1 + the largest position of the call, as transformers does. Undo with :func:`unpatch_model`.
    """
    config = text_config(getattr(model, "config", None) or {})
    model_type = getattr(config, "model_type", "")
    if is_patched(model):
        raise ValueError("model is already patched: call posenc.hf.unpatch_model(model) first")
    if remap is not None and (model_type in ADAPTERS or plan is not None):
        raise ValueError(
            f"remap= works on single-RoPE models; {model_type or type(model).__name__} has a per-layer "
            "position plan"
        )
    if model_type in ADAPTERS or plan is not None:
        _patch_planned(model, config, model_type, rotary, plan)
        return model
    targets = _rotary_targets(model)
    if remap is not None:
        _patch_remap(model, targets, rotary, remap)
        return model
    plans = []  # every target checked before any is patched: a refusal leaves the model as it was
    for name, module in targets:
        config = getattr(module, "config", None) or model.config
        layer_types = rope_layer_types(module)
        if layer_types is not None:
            if rotary is not None:
                raise ValueError(
                    f"rotary= replaces one RoPE; {type(module).__name__} ({name}) has one per layer type "
                    f"({', '.join(layer_types)})"
                )
            rotaries, forwards = plan_typed(module, name, config, model_type, layer_types)
            plans.append((module, rotaries, typed_forward, forwards, False))
            continue
        # the model's own RoPE reproduced in its own hand-out form, also when ``rotary`` replaces it (the
        # form is what carries any rotary into the model)
        form = handout_form(module, name, model_type)
        if rotary is not None and form == "mrope":
            raise ValueError(
                f"rotary= replaces a 1-D RoPE; {type(module).__name__} ({name}) is M-RoPE over several axes"
            )
        rot, forward, layout = own_rotary(module, name, model_type, config, form)
        if rotary is not None:
            _check_rotary(rotary, config, name, layout)
            rot = rotary
        plans.append((module, rot, forward, None, keeps_float32(module)))
    if not plans:
        raise ValueError(f"patch_model found no *RotaryEmbedding module in {type(model).__name__}")
    with _recorded(model) as book:
        for module, rot, forward, forwards, float32 in plans:
            book.set(module, "posenc_rotary", rot.to(device_of(module)))
            if forwards is not None:
                book.set(module, "posenc_forwards", forwards)
            if float32:
                book.set(module, "posenc_float32", True)
            book.set(module, "forward", types.MethodType(forward, module))
    return model


@contextlib.contextmanager
def _recorded(model):
    """The model's ledger for a patch; should applying it fail half-way, what was applied is undone."""
    book = ledger(model)
    try:
        yield book
    except BaseException:
        undo(model)
        raise


def _check_rotary(rotary, config, name: str, layout: str) -> None:
    """A ValueError unless ``rotary`` can stand for the rotary module ``name`` of a model with ``config``
    whose attention pairs dimensions as ``layout`` says: a plain :class:`RotaryEmbedding` with the model's
    head and rotary dimensions and pairing."""
    check_plain(rotary)
    want = {**rope_settings(config, read_elsewhere=temperature_keys(config)), "layout": layout}
    got = {"head_dim": rotary.head_dim, "rotary_dim": rotary.rotary_dim, "layout": rotary.layout}
    for key, value in got.items():
        if value != want[key]:
            raise ValueError(
                f"rotary has {key}={value!r}, but the model's {name} needs {key}={want[key]!r} "
                f"(its config: head_dim {want['head_dim']}, rotary_dim {want['rotary_dim']}, layout "
                f"{want['layout']!r})"
            )


def _rotary_targets(model) -> list:
    """(name, module) of the model's rotary modules patch_model replaces (a vision tower's left alone)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
        and not isinstance(module, RotaryEmbedding)
        and not hasattr(module, "posenc_rotary")
        and not places_image_patches(module)
    ]


def _patch_remap(model, targets, rotary, remap, check: bool = True) -> None:
    """patch_model's remap path; ``check``: first on a tiny replica with a remap that moves nothing."""
    if not isinstance(remap, Remap):
        raise ValueError(f"remap must be a posenc.remap.Remap (SelfExtend, ReRoPE, STRING), got {remap!r}")
    if len(targets) != 1:
        raise ValueError(
            f"remap= needs a model with one rotary module; {type(model).__name__} has {len(targets)}"
        )
    name, module = targets[0]
    config = getattr(module, "config", None) or model.config
    model_type = config_value(config, "model_type", default="")
    form = handout_form(module, name, model_type)
    if form == "mrope":
        raise ValueError(
            f"remap= remaps 1-D distances; {type(module).__name__} ({name}) is M-RoPE over several axes"
        )
    if form == "complex":
        raise ValueError(
            f"remap= rotates the first rotary_dim channels of each head; {type(module).__name__} ({name}) "
            "hands out complex frequencies for attention code that places its rotary channels itself"
        )
    softcap = config_value(text_config(model.config), "attn_logit_softcapping", default=None)
    if softcap is not None:
        raise ValueError(
            f"remap= has no logit soft-capping; {model_type or type(model).__name__} caps its scores at "
            f"attn_logit_softcapping={softcap}"
        )
    own, forward, layout = own_rotary(module, name, model_type, config, form)
    if rotary is not None:
        _check_rotary(rotary, config, name, layout)
    if check:
        check_replica(
            model, lambda replica: _patch_remap(replica, _rotary_targets(replica), None, NoRemap(), False)
        )
    with _recorded(model) as book:
        patch_remap(model, module, forward, own if rotary is None else rotary, remap, book)


def _patch_planned(model, config, model_type: str, rotary, plan) -> None:
    if model_type not in ADAPTERS and plan is None:
        raise ValueError(
            f"patch_model applies plans to {', '.join(sorted(ADAPTERS))}; got model_type {model_type!r}"
        )
    if rotary is not None:
        raise ValueError(
            f"rotary= replaces the one RoPE of single-RoPE families; {model_type} has a per-layer plan: "
            "pass plan= (see posenc.hf.position_plan)"
        )
    expected = position_plan(config)
    plan = expected if plan is None else tuple(plan)
    adapter = None if model_type in ADAPTERS else _single_rope_adapter(model, model_type)
    with _recorded(model) as book:
        patch_layers(model, plan, config, expected, book, adapter)
        patch_windows(model, plan, book)


def _single_rope_adapter(model, model_type: str) -> Attention:
    """How the layers of a single-RoPE family given a plan take cos/sin: in its rotary module's hand-out
    form, read off the module's own output; a ValueError for a form that per-layer cos/sin cannot take."""
    forms = {handout_form(module, name, model_type) for name, module in _rotary_targets(model)}
    if len(forms) != 1 or not forms <= PLANNED_FORMS:
        raise ValueError(
            f"plan= hands each layer cos/sin in its rotary module's hand-out form; {model_type}'s rotary "
            f"modules hand out {', '.join(sorted(forms)) or 'nothing'}, and a plan takes "
            f"{', '.join(sorted(PLANNED_FORMS))}"
        )
    return Attention(forms.pop())


def unpatch_model(model):
    """Undo :func:`patch_model` (whichever way it patched: its ledger, :mod:`posenc.hf.ledger`): the model
    computes its own positions again. Returns the model."""
    undo(model)
    return model
