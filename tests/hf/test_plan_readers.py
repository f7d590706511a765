"""position_plan's readers beyond the patched families, each against transformers' own code: multi-head
latent attention found by its config keys, EXAONE 4's NoPE globals, the length temperature of Ministral 3
and Mistral 4, HunYuan's alpha, the Qwen3.5 hybrids and the M-RoPE layouts of ERNIE-4.5-VL and
HunYuan-V4-VL; the one key check that position_plan and rotary_from_config share, and the refusal of
families whose code lays out M-RoPE sections posenc does not know."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.hf import patch_model, position_plan, rotary_from_config, unpatch_model
from posenc.hf.families import family
from posenc.tools.zoo import _model_class, scaled, tiny_config

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": "max_position_embeddings",
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
}


def _on_meta(model_type, config):
    with torch.device("meta"):
        return _model_class(model_type)(config)


def _modeling(model_type):
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


@pytest.mark.parametrize(
    "model_type",
    ["deepseek_v2", "deepseek_v3", "glm4_moe_lite", "longcat_flash", "axk1", "youtu", "minicpm3"],
)
def test_mla_found_by_its_keys_scale_and_rotation_match_transformers(model_type):
    config = scaled(tiny_config(model_type), YARN)
    plan = position_plan(config)
    attentions = [m for m in _on_meta(model_type, config).modules() if hasattr(m, "qk_rope_head_dim")]
    assert len(attentions) == len(plan)
    for lp, attn in zip(plan, attentions, strict=True):
        assert lp.scale == pytest.approx(attn.scaling, rel=1e-12) and lp.shared_key
        assert lp.rope.rotary_dim == lp.rope.head_dim == attn.qk_rope_head_dim
    assert plan[0].scale > (config.qk_rope_head_dim + config.qk_nope_head_dim) ** -0.5  # the mscale term

    # the rotated slice's scores: transformers' rotary module and the family's own apply function (which
    # may hand q and k back permuted: only their dot products are the model's)
    modeling = _modeling(model_type)
    hf = next(
        m for m in _on_meta(model_type, config).modules() if type(m).__name__.endswith("RotaryEmbedding")
    )
    hf = type(hf)(config)  # built again on the CPU
    d, positions = attentions[0].qk_rope_head_dim, torch.arange(7)[None]
    q, k = torch.randn(2, 1, 2, 7, d, generator=torch.Generator().manual_seed(0))
    handout = hf(q, positions)
    if isinstance(handout, torch.Tensor):  # DeepSeek-V2: e^(i angle)
        q_hf, k_hf = modeling.apply_rotary_emb(q, k, handout)
    elif family(model_type).mla == "half":
        q_hf, k_hf = modeling.apply_rotary_pos_emb(q, k, *handout)
    else:
        q_hf, k_hf = modeling.apply_rotary_pos_emb_interleave(q, k, *handout)
    rot = plan[0].rope.module()
    q_pe, k_pe = (rot.rotate(x.double(), positions=positions[0]) for x in (q, k))
    torch.testing.assert_close(q_pe @ k_pe.mT, (q_hf @ k_hf.mT).double(), atol=2e-5, rtol=1e-5)
    wrong = plan[0].rope.__class__(
        **{**vars(plan[0].rope), "layout": "half" if rot.layout != "half" else "interleaved"}
    )
    q_w, k_w = (wrong.module().rotate(x.double(), positions=positions[0]) for x in (q, k))
    assert (q_w @ k_w.mT - (q_hf @ k_hf.mT).double()).abs().max() > 1e-2  # the pairing shows


def test_mla_of_an_unread_family_is_refused():
    config = {
        "model_type": "my_mla",
        "num_hidden_layers": 2,
        "head_dim": 16,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
    }
    with pytest.raises(ValueError, match="'my_mla' has kv_lora_rank and qk_rope_head_dim"):
        position_plan(config)


@pytest.mark.parametrize(
    ("model_type", "window"),  # ExaoneMoeConfig requires a window
    [("exaone4", True), ("exaone4", False), ("exaone_moe", True), ("kolibri1", True), ("kolibri1", False)],
)
def test_exaone4_rotates_exactly_the_layers_its_attention_rotates(model_type, window):
    config = tiny_config(model_type)
    if not window:
        config.sliding_window = None
    plan = position_plan(config)
    attentions = [m for m in _on_meta(model_type, config).modules() if hasattr(m, "is_sliding")]
    # the model's rule (its attention code): rotate iff sliding_window is None or the layer is sliding
    rotates = [a.sliding_window is None or a.is_sliding for a in attentions]
    assert [lp.rope is not None for lp in plan] == rotates
    assert (False in rotates) is window


def test_exaone4_5_reads_its_text_config():
    plan = position_plan(transformers.AutoConfig.for_model("exaone4_5"))
    assert [lp.rope is None for lp in plan] == [lp.attention == "full" for lp in plan]


@pytest.mark.parametrize("model_type", ["ministral3", "mistral4"])
def test_length_temperature_matches_transformers(model_type):
    config = transformers.AutoConfig.for_model(model_type)
    params = config.rope_parameters
    plan = position_plan(config)
    assert all(lp.temperature == plan[0].temperature for lp in plan)
    positions = torch.tensor([[0, 1, 5, 16383, 16384, 16385, 50000, 10**6]])
    want = _modeling(model_type).get_llama_4_attn_scale(
        positions, params["llama_4_scaling_beta"], params["original_max_position_embeddings"]
    )
    np.testing.assert_allclose(plan[0].temperature(positions)[0].numpy(), want[0, 0, :, 0].numpy(), rtol=1e-6)
    assert "query x log1p(floor(p/" in repr(plan[0])


def test_length_temperature_needs_its_keys():
    config = transformers.AutoConfig.for_model("ministral3").to_dict()
    del config["rope_parameters"]["llama_4_scaling_beta"]
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        position_plan(config)


def test_hunyuan_alpha_is_static_ntk_as_its_module():
    config = tiny_config("hunyuan_v1_dense")
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 1000.0, "factor": 1.0}
    hf = _modeling("hunyuan_v1_dense").HunYuanDenseV1RotaryEmbedding(config)
    rope = position_plan(config)[0].rope
    for inv in (rope.module().inv_freq, rotary_from_config(config).inv_freq):
        np.testing.assert_allclose(inv.numpy(), hf.inv_freq.numpy(), rtol=1e-6)
    assert "ntk x1000" in repr(rope)


BASE = {"model_type": "llama", "num_hidden_layers": 2, "head_dim": 16, "max_position_embeddings": 4096}
YARN_PARAMS = {
    "rope_type": "yarn",
    "rope_theta": 1e4,
    "factor": 4.0,
    "original_max_position_embeddings": 1024,
}


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "wibble": 3}}, "wibble"),
        ({**BASE, "rope_parameters": {**YARN_PARAMS, "llama_4_scaling_beta": 0.1}}, "llama_4_scaling_beta"),
        (
            {
                **BASE,
                "model_type": "mistral",  # sections in a family without M-RoPE
                "rope_parameters": {"rope_theta": 1e4, "mrope_section": [2, 3, 3]},
            },
            "mrope_section",
        ),
        (
            {
                **BASE,
                "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0, "alpha": 9},
            },
            "alpha",
        ),
    ],
)
def test_both_entry_points_refuse_the_same_unknown_rope_key(config, key):
    for entry in (position_plan, rotary_from_config):
        with pytest.raises(ValueError, match=f"'{key}'"):
            entry(config)


@settings(max_examples=40, deadline=None)
@given(
    key=st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
    method=st.sampled_from(["default", "linear", "yarn"]),
)
def test_any_unknown_rope_key_is_refused_by_both(key, method):
    params = {"rope_type": method, "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 1024}
    if method == "default":
        params = {"rope_type": "default", "rope_theta": 1e4}
    if method == "linear":
        del params["original_max_position_embeddings"]
    known = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "max_position_embeddings", *params}
    known |= {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"}
    config = {**BASE, "rope_parameters": {**params, key: 1.0}}
    if key in known:
        return
    for entry in (position_plan, rotary_from_config):
        with pytest.raises(ValueError, match=f"'{key}'"):
            entry(config)


def test_a_per_layer_attribute_is_a_value_error():
    config = transformers.AutoConfig.for_model("dots3_note_text")
    with pytest.raises(ValueError, match="per_layer_config"):
        position_plan(config)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5_moe_text"])
def test_qwen3_5_hybrid_mrope_matches_transformers_and_a_wrong_plan_shows(model_type):
    """Qwen3.5: Gated DeltaNet layers without positions, interleaved M-RoPE over a quarter of the head on
    the attention layers; three axes that differ, where the slot order shows."""
    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = _model_class(model_type)(config).eval()
    plan = position_plan(config)
    assert [lp.attention == "linear" for lp in plan] == [t == "linear_attention" for t in config.layer_types]
    assert all(lp.rope is None for lp in plan if lp.attention == "linear")
    rope = next(lp.rope for lp in plan if lp.rope is not None)
    assert (rope.mrope_order, rope.rotary_dim) == ("interleaved", config.head_dim // 4)

    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    axes = torch.stack([torch.arange(12), torch.arange(12) // 3, torch.arange(12) % 3])[:, None] + 5
    with torch.no_grad():
        want = model(ids, position_ids=axes).logits
        patch_model(model)
        assert (model(ids, position_ids=axes).logits - want).abs().max() < 1e-5 * want.abs().max()
        unpatch_model(model)
        flipped = tuple(
            lp
            if lp.rope is None
            else dataclasses.replace(lp, rope=dataclasses.replace(lp.rope, mrope_order="contiguous"))
            for lp in plan
        )
        patch_model(model, plan=flipped)
        assert (model(ids, position_ids=axes).logits - want).abs().max() > 1e-3
        unpatch_model(model)
    on_linear = tuple(dataclasses.replace(lp, rope=rope) if lp.attention == "linear" else lp for lp in plan)
    with pytest.raises(ValueError, match="linear-attention layer"):
        patch_model(model, plan=on_linear)


def _output(model, ids, positions):
    out = model(ids, position_ids=positions)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("model_type", ["ernie4_5_vl_moe", "hy_v4_vl_text"])
def test_mrope_families_match_transformers_on_differing_axes_and_another_order_shows(model_type):
    """ERNIE-4.5-VL (height and width alternate, time last; pairs (2i, 2i+1)), patched layer by layer;
    HunYuan-V4-VL (Qwen3-VL's order on MLA's rope slice), patched through its rotary module's hand-out."""
    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = _model_class(model_type)(config).eval()
    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    axes = torch.stack([torch.arange(12), torch.arange(12) // 3, torch.arange(12) % 3])[:, None] + 5
    with torch.no_grad():
        want = _output(model, ids, axes)
        patch_model(model)
        assert (_output(model, ids, axes) - want).abs().max() < 1e-5 * want.abs().max()
        unpatch_model(model)
    hf = next(
        m
        for m in model.modules()
        if type(m).__name__.endswith("RotaryEmbedding") and "Vision" not in type(m).__name__
    )
    rope = position_plan(config)[0].rope if model_type.startswith("ernie") else None
    if rope is not None:
        assert rope.mrope_order == "spatial-interleaved" and rope.layout == "interleaved"
    pos = torch.stack([torch.arange(1, 5), torch.arange(3, 11, 2), torch.arange(5, 17, 3)])[:, None]
    own = hf(torch.zeros(1, 4, 1), pos)[0]
    from posenc.hf.plan import mrope_rope

    text = config.get_text_config()
    good = mrope_rope(text)
    other = dataclasses.replace(good, mrope_order="contiguous")
    for spec, close in ((good, True), (other, False)):
        cos = spec.module().cos_sin(pos)[0]
        cos = cos.repeat_interleave(2, -1) if spec.layout == "interleaved" else torch.cat((cos, cos), -1)
        assert bool(torch.allclose(cos, own.float(), atol=1e-5)) is close


@pytest.mark.parametrize("model_type", ["qwen2_5_omni", "hunyuan_vl"])
def test_a_family_whose_code_lays_out_mrope_sections_unknown_to_posenc_is_refused(model_type):
    """Their default configs carry no mrope_section, so the key check alone would plan them as 1-D RoPE;
    their modeling code says they place positions on several axes."""
    with pytest.raises(ValueError, match="lays out M-RoPE sections"):
        position_plan(transformers.AutoConfig.for_model(model_type))
