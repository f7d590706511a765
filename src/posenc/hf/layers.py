"""Applying a per-layer :func:`~posenc.hf.plan.position_plan` to a transformers model.

transformers computes one set of cos/sin per forward (per layer type for Gemma) in its rotary module and
hands it to every attention layer. Patched, the rotary module only records the call's position ids; a
pre-hook on each attention layer replaces the cos/sin it receives with posenc's for that layer's plan
(identity, cos 1 and sin 0, on NoPE layers, which leaves q and k bit-for-bit unchanged), the layer's
softmax scale is set from the plan, and a query temperature scales q_proj's output per position. The
attention pattern (full, sliding, chunked) stays with the model's masks: posenc checks that the plan
agrees with them and refuses a plan it cannot apply.
"""

from __future__ import annotations

import inspect
import types

import torch

from ..rope import RotaryEmbedding
from ..rope.table import call_context
from .families import Attention, family, having
from .ledger import Ledger
from .plan import LayerPlan, Rope

__all__ = ["ADAPTERS", "PLANNED_FORMS", "patch_layers"]

PLANNED_FORMS = frozenset({"half", "pairs", "complex"})  # the hand-out forms _State._form makes


ADAPTERS = having("attention")
"""text model_type -> how its attention layers take cos/sin (tests/hf/test_plans.py covers each)."""


class _State:
    """Per patched model: the position ids of the current call and the cos/sin formed for them."""

    def __init__(self, plan, adapter: Attention):
        self.plan, self.adapter = plan, adapter
        self.position_ids: torch.Tensor | None = None
        self.modules: dict[Rope, object] = {}
        self.memo: dict = {}

    def record(self, position_ids: torch.Tensor) -> None:
        if self.position_ids is not position_ids:
            self.position_ids, self.memo = position_ids, {}

    def text_positions(self) -> torch.Tensor:
        pos = self.position_ids
        # M-RoPE's (3, batch, seq): axis 0 (time) is the text position for text and stands for the
        # token's place wherever only (batch, seq) positions make sense (NoPE shapes, temperature)
        return pos[0] if pos.dim() == 3 else pos

    def cos_sin(self, rope: Rope | None, width: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (rope, width, dtype)
        if key not in self.memo:
            self.memo[key] = self._form(*self._tables(rope, width), dtype)
        return self.memo[key]

    def _tables(self, rope: Rope | None, width: int):
        pos = self.position_ids
        if rope is None:  # the identity rotation, exactly
            text = self.text_positions()
            ones = torch.ones(*text.shape, width, device=pos.device)
            return ones, torch.zeros_like(ones)
        module = self.modules.get(rope)
        if module is None:
            module = self.modules[rope] = rope.module()
        if rope.mrope_section is not None:
            positions = pos if pos.dim() == 3 else pos.expand(3, *pos.shape)
            return module.cos_sin(positions)
        text = self.text_positions()
        # transformers scales length-dependent methods for 1 + the largest position of the whole call
        context = call_context(text)
        return module.cos_sin(text.shape[-1], positions=text, device=pos.device, context_len=context)

    def _form(self, cos, sin, dtype):
        form = self.adapter.form
        if form == "complex":
            return torch.complex(cos.float(), sin.float())
        if form == "pairs":
            return (
                cos.repeat_interleave(2, dim=-1).to(dtype),
                sin.repeat_interleave(2, dim=-1).to(dtype),
            )
        return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((sin, sin), dim=-1).to(dtype)


def attention_layers(model) -> list:
    found = {}
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("Attention") and "Vision" not in name and hasattr(module, "layer_idx"):
            found.setdefault(module.layer_idx, module)
    return [found[i] for i in sorted(found)]


def _rotary_modules(model) -> list:
    return [
        m
        for m in model.modules()
        if type(m).__name__.endswith("RotaryEmbedding")
        and "Vision" not in type(m).__name__
        and not isinstance(m, RotaryEmbedding)
    ]


def _check_plan(plan, layers, adapter: Attention, config, expected) -> None:
    if len(plan) != len(layers):
        raise ValueError(f"plan has {len(plan)} layers, the model {len(layers)} attention layers")
    want_layout = "interleaved" if adapter.form in ("complex", "pairs") else "half"
    if family(_model_type(config)).mla == "config":  # DeepSeek V3's MLA pairs as rope_interleave says
        want_layout = "interleaved" if getattr(config, "rope_interleave", True) else "half"
    for lp, attn, ex in zip(plan, layers, expected, strict=True):
        if not isinstance(lp, LayerPlan):
            raise ValueError(f"plan entries must be LayerPlan, got {type(lp).__name__}")
        if (lp.attention, lp.window) != (ex.attention, ex.window):
            raise ValueError(
                f"plan layer {lp.layer} asks for {lp.attention} attention (window {lp.window}); the model's "
                f"masks give {ex.attention} (window {ex.window}): posenc does not build attention masks"
            )
        if lp.rope is not None and lp.rope.layout != want_layout:
            raise ValueError(
                f"plan layer {lp.layer} pairs dimensions {lp.rope.layout!r}; this model's attention code "
                f"pairs them {want_layout!r}"
            )
        if lp.rope is not None and ex.rope is not None and lp.rope.rotary_dim != ex.rope.rotary_dim:
            raise ValueError(
                f"plan layer {lp.layer} rotates {lp.rope.rotary_dim} dimensions; this model's attention code "
                f"rotates {ex.rope.rotary_dim} (a partial rotary cannot be expressed in its cos/sin)"
            )
        if lp.rope is not None:
            try:  # what the first forward would build: a plan it cannot run is refused now, not then
                lp.rope.module()
            except ValueError as e:
                raise ValueError(f"plan layer {lp.layer}: {e}") from None
        if adapter.fixed_rope and lp.rope is not None and getattr(attn, adapter.fixed_rope) is None:
            raise ValueError(
                f"plan layer {lp.layer} asks for RoPE, but this model's attention code rotates only the "
                f"layers with {adapter.fixed_rope} set; on the others posenc cannot add a rotation"
            )
        if lp.temperature is not None and (not hasattr(attn, "q_proj") or hasattr(attn, "qk_norm")):
            raise ValueError(
                f"plan layer {lp.layer} has a query temperature, applied to the queries before they are "
                "rotated; this layer normalises its rotated queries (qk_norm), which would undo it"
            )


def _check_linear(plan, expected) -> None:
    """A hybrid's recurrent layers are where its config puts them, in any plan: posenc cannot turn one
    into softmax attention or back."""
    if len(plan) != len(expected):
        raise ValueError(f"plan has {len(plan)} layers, the model's config {len(expected)}")
    for lp, ex in zip(plan, expected, strict=True):
        if (lp.attention == "linear") != (ex.attention == "linear"):
            raise ValueError(
                f"plan layer {lp.layer} is {lp.attention} attention; the model's layer {ex.layer} is "
                f"{ex.attention} attention (a hybrid's linear-attention layers stay where they are)"
            )
        if lp.attention == "linear" and (lp.rope, lp.temperature, lp.scale) != (None, None, None):
            raise ValueError(f"plan layer {lp.layer} is a linear-attention layer: it takes no positions")


def _check_takes_positions(layers, config) -> None:
    """A ValueError, before any change, for attention code that takes no cos/sin to replace."""
    for attn in layers:
        if "position_embeddings" not in inspect.signature(type(attn).forward).parameters:
            raise ValueError(
                f"plan= hands each layer its cos/sin as position_embeddings; {type(attn).__name__} "
                f"(model_type {_model_type(config)!r}) takes none"
            )


def _model_type(config) -> str:
    return getattr(config, "model_type", "")


def _pre_hook(state: _State, lp: LayerPlan, width: int):
    def hook(module, args, kwargs):
        if "position_embeddings" not in kwargs or state.position_ids is None:
            raise RuntimeError(
                f"{type(module).__name__} was called without position_embeddings as a keyword, or before the "
                "rotary module: patch_model cannot hand it posenc's positions"
            )
        hidden = args[0] if args else kwargs["hidden_states"]
        tables = state.cos_sin(lp.rope, width, hidden.dtype)
        if isinstance(tables, tuple) and tables[0].shape[-2] != hidden.shape[-2]:
            # Gemma 4 runs its KV-shared layers on the last logits_to_keep tokens only
            tables = tuple(t[..., -hidden.shape[-2] :, :] for t in tables)
        kwargs["position_embeddings"] = tables
        return args, kwargs

    return hook


def _temperature_hook(state: _State, lp: LayerPlan):
    def hook(module, args, output):
        # (batch, seq) scales against q_proj's (batch, seq, features) or a query norm's (batch, heads, seq,
        # head_dim): the sequence is the second axis from the end in both
        scale = lp.temperature(state.text_positions()).to(output.device, output.dtype)
        batch, seq = scale.shape[0] if scale.dim() == 2 else 1, scale.shape[-1]
        return output * scale.reshape(batch, *[1] * (output.dim() - 3), seq, 1)

    return hook


def _record_forward(state: _State):
    def forward(module, x, position_ids, *args, **kwargs):
        state.record(position_ids)
        return type(module).forward(module, x, position_ids, *args, **kwargs)

    return forward


def patch_layers(model, plan, config, expected, book: Ledger, adapter: Attention | None = None) -> None:
    """Apply ``plan`` (one :class:`LayerPlan` per layer) to ``model``, every change into ``book``; see the
    module docstring. ``adapter``: how the layers take cos/sin, for a family without one of its own (a
    single-RoPE family given a plan: its rotary module's hand-out form)."""
    layers = attention_layers(model)
    adapter = ADAPTERS.get(_model_type(config)) or adapter
    _check_takes_positions(layers, config)
    _check_linear(plan, expected)
    plan = [lp for lp in plan if lp.attention != "linear"]  # the attention layers, in order
    expected = [lp for lp in expected if lp.attention != "linear"]
    _check_plan(plan, layers, adapter, config, expected)
    rotaries = _rotary_modules(model)
    if not rotaries:
        raise ValueError(f"patch_model found no *RotaryEmbedding module in {type(model).__name__}")
    state = _State(tuple(plan), adapter)
    for rot in rotaries:
        book.set(rot, "forward", types.MethodType(_record_forward(state), rot))
        book.set(rot, "_posenc_state", state)
    for lp, attn in zip(plan, layers, strict=True):
        width = (lp.rope.rotary_dim if lp.rope else getattr(attn, "qk_rope_head_dim", attn.head_dim)) // 2
        book.hook(attn.register_forward_pre_hook(_pre_hook(state, lp, width), with_kwargs=True))
        if adapter.rope_flag:
            book.set(attn, adapter.rope_flag, True)  # NoPE layers get the identity rotation
        if hasattr(attn, "attn_temperature_tuning"):
            book.set(attn, "attn_temperature_tuning", False)  # posenc applies the plan's temperature instead
        if lp.temperature is not None:  # after the query norm where there is one, which would undo it
            target = getattr(attn, "q_norm", None) or attn.q_proj
            book.hook(target.register_forward_hook(_temperature_hook(state, lp)))
        if lp.scale is not None:
            book.set(attn, "scaling", lp.scale)
