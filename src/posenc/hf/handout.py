"""How a transformers rotary module hands out cos/sin, and posenc's rotary in that hand-out form: the
machinery :func:`posenc.hf.patch_model` patches with.

A rotary module's hand-out form, the shape of the cos/sin it hands out (a key of :data:`FORMS`: each
frequency twice as halves or in a row, once, sin first, or complex), is read off its own output at a few
probe positions (:func:`read_handout_form`; :func:`handout_form` for a module patch_model takes whole), a
module that reads M-RoPE position ids is told by its output's shape (:func:`takes_axis_positions`), and
posenc's rotary in the module's form is checked against the module's own cos/sin before anything is
patched (:func:`check_exact`): exact or refused. The form implies how the attention code pairs dimensions,
posenc's ``layout`` ("half" or "interleaved"), or leaves that to the config. :func:`own_rotary` builds a
single-RoPE module's rotary, :func:`plan_typed` those of a module with one RoPE per layer type (each with
the forward of its form, which :func:`typed_forward` calls).
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Mapping

import torch

from ..rope import RotaryEmbedding
from ..rope.mrope import MRotaryEmbedding
from ..rope.table import call_context
from ..rope.xpos import XPos
from ._config import config_value, rope_settings, temperature_keys
from .families import having
from .plan import MROPE_FAMILIES, mrope_rope

__all__ = [
    "FORMS",
    "PATCHED_FAMILIES",
    "check_exact",
    "check_plain",
    "device_of",
    "handout_form",
    "keeps_float32",
    "own_rotary",
    "places_image_patches",
    "plan_typed",
    "read_handout_form",
    "rope_layer_types",
    "takes_axis_positions",
    "typed_forward",
]


# model types the single-RoPE path of patch_model is tested on (tests/test_hf.py); others with the same
# rotary module layout (inv_freq, attention_scaling, forward(x, position_ids) -> (cos, sin)) also work.
PATCHED_FAMILIES = tuple(having("patched"))


def _cos_sin(module, x, position_ids):
    rot = module.posenc_rotary
    identity = getattr(module, "posenc_identity", None)
    if identity is not None:  # patch_model(remap=): the attention rotates q and k, and checks these positions
        # a new forward starts here (the model's rotary module runs once, before its layers), whichever
        # module the caller ran: what the last forward learnt about positions and its cache is stale
        identity.new_positions(position_ids)
        shape = (*position_ids.shape, rot.rotary_dim // 2)
        return torch.ones(shape, device=x.device), torch.zeros(shape, device=x.device)
    if isinstance(rot, MRotaryEmbedding):  # (axes, batch, seq) position ids, or (batch, seq) for text
        return rot.cos_sin(position_ids.to(x.device))
    # transformers scales length-dependent methods for 1 + the largest position in the whole batch
    context = call_context(position_ids)
    return rot.cos_sin(position_ids.shape[-1], positions=position_ids, device=x.device, context_len=context)


def _half_forward(module, x, position_ids, *args, **kwargs):
    cos, sin = _cos_sin(module, x, position_ids)
    # (batch, seq, rotary_dim): each frequency twice, the halves one after the other (rotate_half families)
    return torch.cat((cos, cos), dim=-1).to(x.dtype), torch.cat((sin, sin), dim=-1).to(x.dtype)


def _pairs_forward(module, x, position_ids, *args, **kwargs):
    cos, sin = _cos_sin(module, x, position_ids)
    # (batch, seq, rotary_dim): each frequency twice in a row (the families that pair (2i, 2i+1))
    return cos.repeat_interleave(2, -1).to(x.dtype), sin.repeat_interleave(2, -1).to(x.dtype)


def _narrow_forward(module, x, position_ids, *args, **kwargs):
    cos, sin = _cos_sin(module, x, position_ids)
    # (batch, seq, rotary_dim/2): each frequency once; the attention code pairs the halves (GPT-OSS)
    return cos.to(_out_dtype(module, x)), sin.to(_out_dtype(module, x))


def check_exact(module, rotary, forward, name: str, model_type: str, layer_type: str | None = None):
    """Exact or refused: a ValueError unless ``forward`` with ``rotary`` hands out what the module itself
    does at positions 1..4, to its float32 rounding."""
    if _mismatch(module, rotary, forward, layer_type) > _probe_tolerance(module):
        of = f"layer type {layer_type!r} of " if layer_type else ""
        raise ValueError(
            f"posenc's cos/sin for {of}{type(module).__name__} ({name}, model_type {model_type!r}) are not "
            "what the model computes itself: posenc does not read this family's RoPE right yet"
        )


def _sin_first_forward(module, x, position_ids, *args, **kwargs):
    cos, sin = _cos_sin(module, x, position_ids)
    # sin first, (batch, seq, rotary_dim/2) each: GPT-J's and CodeGen's order
    return sin.to(_out_dtype(module, x)), cos.to(_out_dtype(module, x))


def _complex_forward(module, x, position_ids, *args, **kwargs):
    cos, sin = _cos_sin(module, x, position_ids)
    # (batch, seq, rotary_dim/2) complex: the attention factor times e^(i angle) (DeepSeek-V2's freqs_cis)
    return torch.complex(cos.float(), sin.float())


def _out_dtype(module, x) -> torch.dtype:
    """x's dtype, or float32 for a module whose own cos/sin stay float32 for half-precision inputs."""
    return torch.float32 if getattr(module, "posenc_float32", False) else x.dtype


# hand-out form: (its forward, the layout it implies, or None when the attention code alone decides it)
FORMS = {
    "half": (_half_forward, "half"),
    "pairs": (_pairs_forward, "interleaved"),
    "narrow": (_narrow_forward, None),
    "sin-first": (_sin_first_forward, None),
    "complex": (_complex_forward, None),
}


def _probe_positions(device, axes: int = 0) -> torch.Tensor:
    """Position ids 1..4, where the frequencies differ: (1, 4), or (axes, 1, 4) with different axes."""
    pos = torch.arange(1, 5, device=device)[None]
    return torch.stack([pos * (a + 1) + a for a in range(axes)]) if axes else pos


def _own_output(module, positions: torch.Tensor, layer_type: str | None = None, dtype=torch.float32):
    """What a rotary module itself hands out at ``positions`` (its class's forward; for ``layer_type`` when
    its RoPE is per layer type), as a (cos, sin) pair of tensors or a 1-tuple of a complex tensor; None when
    it does not run on them or hands out something else."""
    try:
        with torch.no_grad():
            x = torch.zeros(1, positions.shape[-1], 1, device=positions.device, dtype=dtype)
            extra = () if layer_type is None else (layer_type,)
            out = type(module).forward(module, x, positions, *extra)
    except Exception:  # another signature or another kind of position ids
        return None
    if isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        return out
    if isinstance(out, torch.Tensor) and out.is_complex():
        return (out,)
    return None


def device_of(module) -> torch.device:
    return next(iter(module.buffers()), torch.empty(0)).device


def read_handout_form(module, layer_type: str | None = None) -> str | None:
    """A rotary module's hand-out form, read off its own output (not its attributes) at positions 1..4:
    "half" (each frequency twice, cat(f, f)), "pairs" (each frequency twice in a row), "complex"
    (e^(i angle)), "narrow" (each frequency once, cos or sin first, which ``_resolve`` tells apart), or None
    (it does not run on plain position ids)."""
    out = _own_output(module, _probe_positions(device_of(module)), layer_type)
    if out is None:
        return None
    if len(out) == 1:
        return "complex"
    cos = out[0].float()
    width = cos.shape[-1]
    if width >= 4 and width % 2 == 0:
        if torch.equal(cos[..., : width // 2], cos[..., width // 2 :]):
            return "half"
        if torch.equal(cos[..., 0::2], cos[..., 1::2]):
            return "pairs"
    return "narrow"


def takes_axis_positions(module, layer_type: str | None = None) -> bool:
    """Whether a rotary module reads (axes, batch, seq) M-RoPE position ids (2 to 4 axes): it hands out
    (batch, seq, dim) for them, where a plain RoPE module broadcasts them into another shape."""
    for axes in (2, 3, 4):
        out = _own_output(module, _probe_positions(device_of(module), axes), layer_type)
        if out is not None and tuple(out[0].shape[:-1]) == (1, 4):
            return True
    return False


def _probe_tolerance(module) -> float:
    """How far posenc's cos/sin at positions 1..4 may be from a module's own: its float32 rounding (~1e-7),
    or, for a module whose inv_freq a cast to half precision rounded, 16 of that dtype's epsilons. A misread
    RoPE (another base, pairing or width) is off by far more."""
    buf = next((b for b in module.buffers() if b.is_floating_point()), None)
    half = buf is not None and buf.dtype in (torch.float16, torch.bfloat16)
    eps = torch.finfo(buf.dtype).eps if half else 0.0
    return max(1e-5, 16 * eps)


def _mismatch(module, rotary, forward, layer_type: str | None = None) -> float:
    """The largest difference between what ``forward`` with ``rotary`` hands out and what the module itself
    does at positions 1..4 (inf for another shape or dtype); for M-RoPE, on axes that differ."""
    axes = len(rotary.mrope_section) if isinstance(rotary, MRotaryEmbedding) else 0
    pos = _probe_positions(device_of(module), axes)
    own = _own_output(module, pos, layer_type)
    with torch.no_grad():
        ours = forward(
            types.SimpleNamespace(posenc_rotary=rotary), torch.zeros(1, 4, 1, device=pos.device), pos
        )
    ours = ours if isinstance(ours, tuple) else (ours,)
    wide = torch.complex128 if own[0].is_complex() else torch.float64
    diffs = [
        (a.to(wide) - b.to(wide)).abs().max().item() if a.shape == b.shape else math.inf
        for a, b in zip(own, ours, strict=True)
    ]
    return max(diffs)


def typed_forward(module, x, position_ids, layer_type, *args, **kwargs):
    """The forward of a rotary module whose RoPE is per layer type (``forward(x, position_ids,
    layer_type)``: OLMo 3, ModernBERT, LFM3, ...): that type's posenc rotary in that type's hand-out form,
    in float32 when the module's own cos/sin stay float32 for half-precision inputs."""
    rotary, forward, keeps_float32 = module.posenc_rotary[layer_type], *module.posenc_forwards[layer_type]
    cos, sin = forward(types.SimpleNamespace(posenc_rotary=rotary), x, position_ids)
    return (cos.float(), sin.float()) if keeps_float32 else (cos, sin)


def rope_layer_types(module) -> list[str] | None:
    """The layer types of a rotary module that keeps one RoPE per layer type (its forward takes
    ``layer_type``), those with RoPE; None for a module with one RoPE."""
    try:
        takes_type = "layer_type" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return None
    kinds = getattr(module, "rope_type", None)
    if not takes_type or not isinstance(kinds, dict) or not kinds:
        return None  # one RoPE (ESM's forward takes a layer_type it ignores, its rope_type dict is empty)
    return sorted(kinds)


def _type_head_dim(values: dict, layer_type: str) -> dict:
    """{"head_dim": d} when every layer of ``layer_type`` has head dimension d in the config's
    ``per_layer_config`` (Gemma 4 Unified's global layers: 512 where the others have 256); else {}."""
    per_layer = values.get("per_layer_config") or {}
    dims = {
        (per_layer.get(str(i)) or per_layer.get(i) or {}).get("head_dim")
        for i, t in enumerate(values.get("layer_types") or [])
        if t == layer_type
    }
    return {"head_dim": dims.pop()} if len(dims) == 1 and None not in dims else {}


def plan_typed(module, name: str, config, model_type: str, layer_types: list[str]):
    """posenc's rotaries, and the forwards of their hand-out forms, for each layer type of a per-layer-type
    rotary module (``{layer_type: rotary}``, ``{layer_type: (forward, keeps float32)}``), each checked against
    the module's own cos/sin; a ValueError naming the layer type where one is not exact."""
    params = config_value(config, "rope_parameters")
    base = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    rotaries, forwards = {}, {}
    for layer_type in layer_types:
        mrope = takes_axis_positions(module, layer_type)
        if mrope and model_type.removesuffix("_text") not in MROPE_FAMILIES:
            raise ValueError(
                f"{type(module).__name__} ({name}, layer type {layer_type!r}) takes M-RoPE position ids of "
                f"several axes, and posenc has no M-RoPE layout for model_type {model_type!r}"
            )
        form = None if mrope else read_handout_form(module, layer_type)
        known = mrope or form is not None
        if not known or not isinstance(params, Mapping) or not isinstance(params.get(layer_type), Mapping):
            raise ValueError(
                f"patch_model does not know how {type(module).__name__} ({name}) hands out cos/sin for "
                f"layer type {layer_type!r}"
            )
        flat = {**base, **_type_head_dim(base, layer_type), "rope_parameters": dict(params[layer_type])}
        if mrope:
            rot, forward, _ = _mrope_rotary(module, flat)
        else:
            settings = rope_settings(flat, read_elsewhere=temperature_keys(flat))
            forward, layout = _resolve(module, form, settings, layer_type)
            rot = RotaryEmbedding(**{**settings, "layout": layout}).to(device_of(module))
        check_exact(module, rot, forward, name, model_type, layer_type)
        rotaries[layer_type] = rot
        forwards[layer_type] = (forward, keeps_float32(module, layer_type))
    return torch.nn.ModuleDict(rotaries), forwards


def own_rotary(module, name: str, model_type: str, config, form: str):
    """(posenc's RotaryEmbedding of the module's own RoPE, the forward of its hand-out ``form``, the layout),
    checked against what the module hands out itself (a ValueError unless exact)."""
    if form == "mrope":
        rot, forward, layout = _mrope_rotary(module, config)
        check_exact(module, rot, forward, name, model_type)
        return rot, forward, layout
    # a query temperature in the RoPE dict stays with the model's attention code, which applies it
    settings = rope_settings(config, read_elsewhere=temperature_keys(config))
    if getattr(module, "rope_type", None) == "default" and settings["scaling"] is not None:
        settings = {**settings, "scaling": None}  # built to skip the config's scaling (Molmo2's unscaled one)
    forward, layout = _resolve(module, form, settings)
    rot = RotaryEmbedding(**{**settings, "layout": layout}).to(device_of(module))
    check_exact(module, rot, forward, name, model_type)
    return rot, forward, layout


def _mrope_rotary(module, config):
    """(posenc's M-RoPE for a rotary module of a family whose layout posenc knows, the forward of its
    hand-out form, its layout); checked by the caller."""
    rope = mrope_rope(config)
    forward, layout = FORMS["pairs" if rope.layout == "interleaved" else "half"]
    return rope.module().to(device_of(module)), forward, layout


def _resolve(module, form: str, settings: dict, layer_type: str | None = None):
    """The forward and layout of a hand-out ``form``; a "narrow" one is cos first (GPT-OSS) or sin first
    (GPT-J, CodeGen), whichever is the module's own, and its layout is the config's."""
    if form == "narrow":
        own = RotaryEmbedding(**settings).to(device_of(module))
        form = min(("narrow", "sin-first"), key=lambda f: _mismatch(module, own, FORMS[f][0], layer_type))
    forward, layout = FORMS[form]
    return forward, layout or settings["layout"]


def keeps_float32(module, layer_type: str | None = None) -> bool:
    """Whether a rotary module's own cos/sin stay float32 for a bfloat16 input (GPT-J, CodeGen, OLMo 3)."""
    own = _own_output(module, _probe_positions(device_of(module)), layer_type, torch.bfloat16)
    return own is not None and own[0].dtype == torch.float32


def places_image_patches(module) -> bool:
    """Whether a rotary module is a vision tower's (its config's ``rope_type`` is "axial": 2-D positions of
    image patches, which patch_model leaves to the model; posenc's own is
    :class:`posenc.AxialRotaryEmbedding`)."""
    params = config_value(getattr(module, "config", None) or {}, "rope_parameters")
    return isinstance(params, Mapping) and params.get("rope_type") == "axial"


def handout_form(module, name: str, model_type: str) -> str:
    """The hand-out form of a single-RoPE rotary module (:func:`read_handout_form`'s, or "mrope" for the
    M-RoPE of a family posenc knows), or a ValueError saying why posenc cannot take it."""
    if takes_axis_positions(module):
        if model_type.removesuffix("_text") in MROPE_FAMILIES:
            return "mrope"  # a family whose M-RoPE posenc knows, patched through its rotary module
        raise ValueError(
            f"{type(module).__name__} ({name}) takes M-RoPE position ids of several axes; posenc knows the "
            f"M-RoPE layouts of {', '.join(sorted(MROPE_FAMILIES))}, and model_type {model_type!r} is not "
            "one of them"
        )
    form = (
        read_handout_form(module)
        if hasattr(module, "inv_freq") or hasattr(module, "embed_positions")
        else None
    )
    if form is None:
        raise ValueError(
            f"patch_model does not know how {type(module).__name__} ({name}) hands out cos/sin: it neither "
            "keeps inv_freq nor hands out (cos, sin) or e^(i angle) for plain position ids; tested: "
            f"{', '.join(PATCHED_FAMILIES)}"
        )
    return form


def check_plain(rotary) -> None:
    """A ValueError unless ``rotary`` is a plain :class:`RotaryEmbedding`: a model's rotary module hands
    out cos/sin only and the model's attention rotates with them, so a subclass's own forward, rotate or
    key handling (xPos scales keys otherwise than queries) would never run."""
    if not isinstance(rotary, RotaryEmbedding):
        raise ValueError(f"rotary must be a posenc.RotaryEmbedding or None, got {type(rotary).__name__}")
    if type(rotary) is not RotaryEmbedding:
        does = "does more than rotate (xPos scales queries and keys too)"
        if not isinstance(rotary, XPos):
            does = "is a RotaryEmbedding subclass, whose own forward and rotate the model never calls"
        raise ValueError(
            f"rotary={type(rotary).__name__}(...) {does}, which the cos/sin a model's rotary module hands "
            "out cannot carry; pass a posenc.RotaryEmbedding"
        )
