"""position_plan: what each family's config says about every layer, checked against transformers' own
modules and the papers' formulas; what patch_model refuses; Llama 4's temperature under left padding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from posenc.hf import LayerPlan, patch_model, position_plan, unpatch_model

from .families import FAMILIES, TOL, build


def config_of(name, **changes):
    cfg_cls, _, kwargs = FAMILIES[name]
    return getattr(transformers, cfg_cls)(**{**kwargs, **changes})


def test_llama4_no_rope_layers_mean_has_rope():
    plan = position_plan(config_of("llama4", num_hidden_layers=8, no_rope_layers=None))
    # the default: every 4th layer without RoPE, with full attention and the temperature
    assert [lp.rope is not None for lp in plan] == [True, True, True, False] * 2
    assert [lp.attention for lp in plan] == ["chunked"] * 3 + ["full"] + ["chunked"] * 3 + ["full"]
    assert all(lp.window == 8 for lp in plan if lp.attention == "chunked")
    assert [lp.temperature is not None for lp in plan] == [lp.rope is None for lp in plan]
    assert plan[0].rope.layout == "interleaved"
    explicit = position_plan(config_of("llama4", no_rope_layers=[0, 1, 1, 1]))
    assert [lp.rope is not None for lp in explicit] == [False, True, True, True]
    assert repr(plan[3]) == "layer 3: NoPE | full | query x log1p(floor((p+1)/4))*0.5+1"
    assert repr(plan[0]) == "layer 0: RoPE(base=500000, dims 16/16, interleaved) | chunked 8"


def test_llama4_temperature_formula():
    # Nakanishi 2025 as Llama 4 uses it: log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1
    temperature = position_plan(config_of("llama4"))[3].temperature
    p = np.arange(0, 40)
    np.testing.assert_allclose(
        temperature(torch.arange(40)).numpy(), np.log(np.floor((p + 1) / 4) + 1) * 0.5 + 1, rtol=1e-6
    )


def test_gemma3_rope_per_layer_type_matches_transformers():
    model, config = build("gemma3")
    plan = position_plan(config)
    hf = model.model.rotary_emb
    for lp, layer_type in zip(plan, config.layer_types, strict=True):
        inv = lp.rope.module().inv_freq
        np.testing.assert_allclose(inv.numpy(), getattr(hf, f"{layer_type}_inv_freq").numpy(), rtol=1e-6)
        assert lp.scale == model.model.layers[lp.layer].self_attn.scaling
    assert [lp.attention for lp in plan] == ["sliding", "full"] * 2 and plan[0].window == 8
    assert "linear x8" in repr(plan[1].rope) and "linear" not in repr(plan[0].rope)


def test_gemma3_config_json_form():
    # Gemma 3 27B's published values, typed here: global base 1e6 with linear x8, local base 1e4
    raw = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "head_dim": 128,
        "num_attention_heads": 32,
        "hidden_size": 5376,
        "query_pre_attn_scalar": 168,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
    }
    plan = position_plan(raw)
    want = position_plan(transformers.Gemma3TextConfig(**{k: v for k, v in raw.items() if k != "model_type"}))
    assert plan == want
    assert [lp.rope.base for lp in plan[:6]] == [1e4] * 5 + [1e6]
    assert plan[5].rope.scaling_dict == {"rope_type": "linear", "factor": 8.0}
    assert plan[0].scale == pytest.approx(168**-0.5)


def test_cohere2_rotates_sliding_layers_only_with_interleaved_pairs():
    plan = position_plan(config_of("cohere2"))
    assert [lp.rope is not None for lp in plan] == [True, True, True, False]
    assert plan[0].rope.layout == "interleaved" and plan[3].attention == "full"


def test_smollm3_no_rope_layers():
    plan = position_plan(config_of("smollm3", no_rope_layers=[1, 0, 1, 0]))
    assert [lp.rope is not None for lp in plan] == [True, False, True, False]
    assert all(lp.temperature is None and lp.attention == "full" for lp in plan)


def test_deepseek_v3_softmax_scale_and_slice_match_transformers():
    model, config = build("deepseek_v3")
    plan = position_plan(config)
    attn = model.model.layers[0].self_attn
    assert plan[0].scale == pytest.approx(attn.scaling, rel=1e-12)
    assert plan[0].scale > 16**-0.5  # the mscale_all_dim term is there
    assert (plan[0].rope.head_dim, plan[0].rope.layout, plan[0].shared_key) == (8, "interleaved", True)
    rot = plan[0].rope.module()
    hf = model.model.rotary_emb
    np.testing.assert_allclose(rot.inv_freq.numpy(), hf.inv_freq.numpy(), rtol=1e-6)
    assert rot.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-12)


def test_qwen_vl_sections():
    for name, interleaved in (("qwen2_vl", False), ("qwen2_5_vl", False), ("qwen3_vl", True)):
        rope = position_plan(config_of(name))[0].rope
        assert rope.mrope_section == (4, 2, 2) and (rope.mrope_order == "interleaved") is interleaved
    # early Qwen2-VL config.json: rope_scaling type "mrope" means default RoPE
    raw = {
        "model_type": "qwen2_vl",
        "text_config": None,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    rope = position_plan(raw)[0].rope
    assert (rope.base, rope.mrope_section, rope.scaling) == (1e6, (2, 3, 3), ())


def test_unsupported_keys_and_values_are_named():
    base = {"model_type": "llama", "num_hidden_layers": 2, "head_dim": 16}
    with pytest.raises(ValueError, match="'rope_magic'"):
        position_plan({**base, "rope_magic": 3})
    with pytest.raises(ValueError, match="'indexed_attention'"):
        position_plan({**base, "layer_types": ["full_attention", "indexed_attention"]})
    with pytest.raises(ValueError, match="rope_type"):
        position_plan({**base, "rope_scaling": {"rope_type": "warp", "factor": 2.0}})
    with pytest.raises(ValueError, match="no_rope_layers"):
        position_plan({**base, "model_type": "smollm3", "no_rope_layers": [1, 2]})
    with pytest.raises(ValueError, match="config"):
        position_plan(42)


def test_single_rope_families_keep_one_rope():
    plan = position_plan({"model_type": "llama", "num_hidden_layers": 3, "head_dim": 16, "rope_theta": 5e5})
    assert len(plan) == 3 and len({lp.rope for lp in plan}) == 1 and plan[0].rope.base == 5e5
    assert isinstance(plan[0], LayerPlan) and plan[0].rope.layout == "half"


def test_patch_model_refuses_what_it_cannot_apply():
    model, config = build("cohere2")
    plan = position_plan(config)
    with pytest.raises(ValueError, match="sliding_window"):  # RoPE on Cohere2's global layer
        patch_model(model, plan=plan[:3] + (dataclasses.replace(plan[3], rope=plan[0].rope),))
    with pytest.raises(ValueError, match="masks"):
        patch_model(model, plan=(dataclasses.replace(plan[0], window=16),) + plan[1:])
    with pytest.raises(ValueError, match="pairs"):
        half = dataclasses.replace(plan[0].rope, layout="half")
        patch_model(model, plan=tuple(dataclasses.replace(lp, rope=half) for lp in plan))
    with pytest.raises(ValueError, match="rotates 8 dimensions"):
        partial = dataclasses.replace(plan[0].rope, rotary_dim=8)
        patch_model(
            model, plan=tuple(dataclasses.replace(lp, rope=partial if lp.rope else None) for lp in plan)
        )
    with pytest.raises(ValueError, match="3 layers"):
        patch_model(model, plan=plan[:3])
    with pytest.raises(ValueError, match="plan="):
        patch_model(model, rotary=plan[0].rope.module())
    patch_model(model)
    with pytest.raises(ValueError, match="already patched"):
        patch_model(model)
    unpatch_model(model)
    model, config = build("llama4")
    plan = position_plan(config)
    temperature = plan[3].temperature
    assert model.model.layers[0].self_attn.qk_norm is not None
    with pytest.raises(ValueError, match="normalises its rotated queries"):  # Llama 4's L2 norm after RoPE
        patch_model(model, plan=(dataclasses.replace(plan[0], temperature=temperature), *plan[1:]))


def test_llama4_temperature_follows_positions_under_left_padding():
    # transformers' Llama 4 scales NoPE queries by the cache index, not by position_ids: with left padding
    # a sequence's output depends on its padding. posenc's plan uses the positions, so the padded sequence
    # gives what it gives alone.
    model, _ = build("llama4")
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(3))
    pad = 5
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, 20, dtype=torch.long)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(ids).logits
        hf = model(padded, attention_mask=mask, position_ids=positions).logits[:, pad:]
        patch_model(model)
        ours_alone = model(ids).logits
        ours = model(padded, attention_mask=mask, position_ids=positions).logits[:, pad:]
        unpatch_model(model)
    assert float((ours_alone - alone).abs().max()) <= TOL
    assert float((ours - alone).abs().max()) <= TOL
    assert float((hf - alone).abs().max()) > 1e-3


def test_gemma4_proportional_rope_on_its_own_head_dim():
    model, config = build("gemma4")
    plan = position_plan(config)
    hf = model.model.rotary_emb
    for lp, layer_type in zip(plan, config.layer_types, strict=True):
        inv = lp.rope.module().inv_freq
        np.testing.assert_allclose(inv.numpy(), getattr(hf, f"{layer_type}_inv_freq").numpy(), rtol=1e-6)
        assert lp.rope.head_dim == model.model.layers[lp.layer].self_attn.head_dim
    full = plan[1].rope.module().inv_freq
    # p-RoPE: all 16 pairs of the 32-dim head take part, the last 12 with frequency 0 (not a partial rotary)
    assert plan[1].rope.rotary_dim == 32 and bool((full[4:] == 0).all()) and bool((full[:4] > 0).all())
    assert all(lp.scale == 1.0 for lp in plan)
    raw = {**config.to_dict(), "global_head_dim": 32}
    raw.pop("per_layer_config")
    assert position_plan(raw) == plan


def test_llama4_scout_equal_freq_factors():
    # Llama 4 Scout's published rope_scaling has high_freq_factor == low_freq_factor (an empty blend band);
    # typed here, no download. Frequencies equal transformers' llama3 computation for it.
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "factor": 16.0,
        "high_freq_factor": 1.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    raw = {
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        "head_dim": 128,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "max_position_embeddings": 10485760,
        "rope_theta": 500000.0,
        "rope_scaling": scaling,
    }
    plan = position_plan(raw)
    config = transformers.Llama4TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    np.testing.assert_allclose(plan[0].rope.module().inv_freq.numpy(), want.numpy(), rtol=2.5e-6)


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"rope_type": "linear", "factor": float("nan")}, r"scaling\['factor'\] must be a finite number"),
        ({"rope_type": "linear", "factor": -2.0}, r"scaling\['factor'\] must be >= 1.0, got -2.0"),
        ({"rope_type": "linear", "factor": 0.5}, r"scaling\['factor'\] must be >= 1.0, got 0.5"),
        (
            {"rope_type": "yarn", "factor": 4.0, "beta_fast": float("inf")},
            r"scaling\['beta_fast'\] must be a finite number",
        ),
    ],
)
def test_position_plan_refuses_what_rotary_from_config_refuses(parameters, message):
    """position_plan returned plans with these factors, which rotary_from_config refuses; both now run the
    same check and name the key."""
    from posenc.hf import rotary_from_config

    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, rope_parameters={"rope_theta": 1e4, **parameters}
    )
    for read in (rotary_from_config, position_plan):
        with pytest.raises(ValueError, match=message):
            read(config)


def test_position_plan_refuses_m_rope_sections_the_head_cannot_hold():
    """An mrope_section of more pairs than the rotary dimension has gave a plan that MRotaryEmbedding
    refuses to build; the plan is refused by the same check."""
    config = transformers.Qwen2VLTextConfig(
        hidden_size=256,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [40, 40, 40]},
    )
    with pytest.raises(ValueError, match=r"mrope_section \[40, 40, 40\] sums to 120 pairs, .* has 64"):
        position_plan(config)
