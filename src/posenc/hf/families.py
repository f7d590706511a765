"""Everything posenc knows about each transformers model family, in one table: :data:`FAMILIES`.

A :class:`Family` says how the family's code pairs dimensions (its layout, in posenc's words: "interleaved",
(2i, 2i+1), or "half", (i, i + d/2)), whether its config may name no RoPE key, whether the single-RoPE
path of :func:`~posenc.hf.patch_model` is tested on it, which reader of :mod:`posenc.hf.plan` gives its
per-layer plan, how its attention layers take cos/sin (their hand-out form), its M-RoPE and whether its
language model sits in a ``text_config``. The tables the readers and patchers use
(:data:`~posenc.hf.INTERLEAVED_MODEL_TYPES`, :data:`~posenc.hf.PATCHED_FAMILIES`, ``plan.READERS``,
``plan.MROPE_FAMILIES``, ``layers.ADAPTERS``) are views of this one. This module imports nothing of
posenc.
"""

from __future__ import annotations

import dataclasses

__all__ = ["FAMILIES", "Attention", "Family", "MRopeFamily", "family", "having"]


@dataclasses.dataclass(frozen=True)
class Attention:
    """How one family's attention code takes positions.

    form: the hand-out form of the cos/sin its attention expects (a key of ``posenc.hf.handout.FORMS``):
        "half" (each frequency twice, cat(f, f)), "pairs" (each frequency twice in a row, Cohere) or
        "complex" (Llama 4's freqs_cis).
    rope_flag: the attention attribute that switches its rotation on; set True on every layer, so that
        NoPE layers rotate by the identity and any layer can take RoPE.
    fixed_rope: the attention attribute whose being set decides, in the model's code, which layers
        rotate ("sliding_window" for Cohere2); a plan can take RoPE away from those, not add it elsewhere.
    """

    form: str = "half"
    rope_flag: str | None = None
    fixed_rope: str | None = None


@dataclasses.dataclass(frozen=True)
class MRopeFamily:
    """What one M-RoPE family's code does: its default ``mrope_section`` (pairs per axis: time, height,
    width, ...; None: the pairs split evenly over ``axes``), how the axes' frequency slots are laid out
    (``order``, one of :data:`posenc.rope.mrope.ORDERS`: "contiguous" sections as Qwen2-VL, "interleaved"
    t, h, w, t, h, w, ... as Qwen3-VL, "spatial-interleaved" h, w, h, w, ..., then t as ERNIE-4.5-VL), how
    its attention pairs dimensions (``layout``: "half", (i, i + d/2), or "interleaved", (2i, 2i+1)), and,
    where its config lists the sections in another order than the position ids' axes, which axis each entry
    is for (``listed``: ERNIE's (height, width, time) is (1, 2, 0))."""

    section: tuple[int, ...] | None
    order: str = "contiguous"
    layout: str = "half"
    axes: int = 3
    listed: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Family:
    """One transformers ``model_type`` and what posenc knows of it.

    interleaved: its code pairs dimensions (2i, 2i+1), layout "interleaved" (for reading a config alone;
        patch_model reads the layout off what the model's rotary module hands out).
    rope_implied: its config.json may name no RoPE key at all (early Llama files relied on the default).
    patched: the single-RoPE path of patch_model is tested on it (tests/test_hf.py).
    plan: the reader of :mod:`posenc.hf.plan` that gives its per-layer plan ("gemma3", "qwen_vl", ...).
    attention: how its attention layers take cos/sin, for the families patched layer by layer.
    mrope: its M-RoPE (the composite model_type's entry; NeoMME's own, which is its language model).
    composite: its language model's config is its ``text_config``.
    mla: its attention is DeepSeek's multi-head latent attention (DeepSeek-AI 2024,
        arxiv.org/abs/2405.04434), read from its code: RoPE on the ``qk_rope_head_dim`` slice of q and of
        one key head shared by all heads, softmax scale qk_head_dim^-1/2 times YaRN's
        mscale(factor, mscale_all_dim)^2; the slice's layout is "config" (``rope_interleave``, default
        True: (2i, 2i+1)), "interleaved" or "half" (its code fixes it).
    length_temperature: its attention multiplies queries by 1 + beta ln(1 + floor(p / L0)), with beta the
        ``llama_4_scaling_beta`` and L0 the ``original_max_position_embeddings`` of ``rope_parameters``.
    ntk_alpha: its rotary module reads a "dynamic" ``rope_parameters`` with ``alpha`` as static NTK, base
        times alpha^(d/(d-2)) (HunYuan).
    rope_type_aliases: ``rope_type`` names its config class renames (Phi-3's "su" and "yarn" are LongRoPE).
    rotary_width: the config key giving the rotary width in dimensions (GPT-J's ``rotary_dim``), read
        instead of a fraction of the head.
    """

    model_type: str
    interleaved: bool = False
    rope_implied: bool = False
    patched: bool = False
    plan: str | None = None
    attention: Attention | None = None
    mrope: MRopeFamily | None = None
    composite: bool = False
    mla: str | None = None
    length_temperature: bool = False
    ntk_alpha: bool = False
    rope_type_aliases: tuple[tuple[str, str], ...] = ()
    rotary_width: str | None = None


def _mrope(
    name: str, mrope: MRopeFamily, *, flat: bool = False, layers: bool = True
) -> tuple[Family, Family]:
    """A vision-language family's two entries: the composite (its M-RoPE; read as a flat config when early
    config.json files were flat) and its text model, patched layer by layer, or, with ``layers=False`` (an
    attention whose other position terms posenc does not plan), through its rotary module's hand-out."""
    composite = Family(name, mrope=mrope, composite=True, plan="qwen_vl" if flat else None)
    interleaved = mrope.layout == "interleaved"
    if not layers:
        return composite, Family(f"{name}_text", interleaved=interleaved)
    # its attention takes the cos/sin of its layout: each frequency twice in a row, or the halves repeated
    form = "pairs" if interleaved else "half"
    return composite, Family(
        f"{name}_text", interleaved=interleaved, plan="qwen_vl", attention=Attention(form)
    )


FAMILIES: tuple[Family, ...] = (
    # single RoPE, read from the config and patched through the rotary module
    Family("llama", rope_implied=True, patched=True),
    Family("mistral", rope_implied=True),
    Family("mixtral", rope_implied=True),
    Family("qwen2", rope_implied=True, patched=True),
    Family("gemma", rope_implied=True),
    Family("gpt_neox", rope_implied=True, patched=True),
    Family(
        "phi3", rope_implied=True, patched=True, rope_type_aliases=(("su", "longrope"), ("yarn", "longrope"))
    ),
    Family("gptj", interleaved=True, rope_implied=True, patched=True, rotary_width="rotary_dim"),
    Family("codegen", interleaved=True, rotary_width="rotary_dim"),
    Family("cohere", interleaved=True, patched=True),
    Family("cohere2_moe", interleaved=True, patched=True),
    Family("blt", interleaved=True),
    Family("deepseek_v2", interleaved=True, mla="interleaved"),  # e^(i angle) on pairs (2i, 2i+1)
    Family("ministral3", length_temperature=True),
    Family("hunyuan_v1_dense", ntk_alpha=True),
    Family("hunyuan_v1_moe", ntk_alpha=True),
    # DeepSeek's MLA, each read from its attention code (plans: the "mla" reader, by structure)
    Family("deepseek_v32", mla="interleaved"),
    Family("mistral4", mla="config", length_temperature=True),
    Family("mistral_large4", mla="interleaved"),
    Family("glm4_moe_lite", mla="config"),
    Family("glm_moe_dsa", mla="interleaved"),
    Family("longcat_flash", mla="interleaved"),
    Family("axk1", mla="config"),
    Family("axk2", mla="interleaved"),
    Family("youtu", mla="config"),
    Family("bailing_hybrid", mla="interleaved"),
    Family("hy_v4", mla="half"),
    Family("minicpm3", mla="half"),
    # NoPE on full-attention layers whenever the config has a sliding window (EXAONE 4's rule)
    Family("exaone4", plan="exaone4"),
    Family("exaone_moe", plan="exaone4"),
    Family("exaone4_5", composite=True),  # its text_config is an exaone4 config
    Family("kolibri1", plan="exaone4"),
    # per-layer plans, patched layer by layer
    Family(
        "cohere2", interleaved=True, plan="cohere2", attention=Attention("pairs", fixed_rope="sliding_window")
    ),
    Family("llama4", composite=True),
    Family("llama4_text", plan="llama4", attention=Attention("complex", rope_flag="use_rope")),
    Family("smollm3", plan="smollm3", attention=Attention("half", rope_flag="use_rope")),
    Family("gemma3", composite=True),
    Family("gemma3_text", plan="gemma3", attention=Attention("half")),
    Family("gemma4", composite=True),
    Family("gemma4_text", plan="gemma4", attention=Attention("half")),
    Family("deepseek_v3", plan="mla", attention=Attention("half"), mla="config"),
    # M-RoPE
    *_mrope("qwen2_vl", MRopeFamily((16, 24, 24)), flat=True),
    *_mrope("qwen2_5_vl", MRopeFamily((16, 24, 24)), flat=True),
    *_mrope("qwen3_vl", MRopeFamily((24, 20, 20), "interleaved"), flat=True),
    *_mrope("qwen3_vl_moe", MRopeFamily((24, 20, 20), "interleaved")),
    *_mrope("glm4v", MRopeFamily((8, 12, 12), layout="interleaved")),  # over a partial rotary, as GLM-4V-MoE
    *_mrope("glm4v_moe", MRopeFamily((8, 12, 12))),
    *_mrope("glm_image", MRopeFamily((8, 12, 12))),  # GLM-4V-MoE's rotary and attention
    *_mrope("glm_ocr", MRopeFamily((8, 12, 12), layout="interleaved")),  # GLM-4V's
    *_mrope("paddleocr_vl", MRopeFamily((16, 24, 24))),
    *_mrope("cosmos3_edge", MRopeFamily((24, 20, 20), "interleaved")),
    # Qwen3.5: Qwen3-VL's interleaved M-RoPE over a partial rotary, in a hybrid with Gated DeltaNet layers
    *_mrope("qwen3_5", MRopeFamily((11, 11, 10), "interleaved")),
    *_mrope("qwen3_5_moe", MRopeFamily((11, 11, 10), "interleaved")),
    *_mrope(
        "ernie4_5_vl_moe",
        MRopeFamily((22, 22, 20), "spatial-interleaved", layout="interleaved", listed=(1, 2, 0)),
    ),
    # NeoMME: rows and columns alternate pair by pair, one RoPE per layer type
    Family("neomme", mrope=MRopeFamily(None, "interleaved", axes=2)),
    # HunYuan-V4-VL: Qwen3-VL's M-RoPE on the rope slice of MLA, whose sparse-attention indexer rotates too
    *_mrope("hy_v4_vl", MRopeFamily((24, 20, 20), "interleaved"), layers=False),
)

_BY_TYPE = {f.model_type: f for f in FAMILIES}


def family(model_type: str) -> Family:
    """The entry of ``model_type``; a bare :class:`Family` (nothing known) for any other."""
    return _BY_TYPE.get(model_type) or Family(model_type)


def having(field: str) -> dict[str, object]:
    """``{model_type: value}`` of every family whose ``field`` is set (truthy), in table order."""
    return {f.model_type: getattr(f, field) for f in FAMILIES if getattr(f, field)}
