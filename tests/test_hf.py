"""posenc.hf against transformers: tiny random models give the same logits with posenc computing their
RoPE."""

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import posenc
from posenc import RotaryEmbedding
from posenc.hf import consistent_cache, patch_model, rotary_from_config, unpatch_model

LOGITS_TOL = 1e-5
COMMON = {
    "vocab_size": 128,
    "pad_token_id": 0,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
LONG = np.linspace(1.0, 4.0, 8).tolist()  # Phi-3: head_dim 16 -> 8 pairs
SHORT = np.linspace(1.0, 1.2, 8).tolist()
PHI3_LONGROPE = dict(
    COMMON,
    max_position_embeddings=128,
    original_max_position_embeddings=32,
    rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
)

MODELS = {
    # name: (config class, model class, config kwargs, sequence length)
    "llama-llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            COMMON,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_theta=5e5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        48,
    ),
    "llama-yarn": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            COMMON,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 1e4,
            },
        ),
        48,
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(COMMON, num_key_value_heads=2, max_position_embeddings=64, rope_theta=1e6),
        40,
    ),
    "qwen2-dynamic": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            COMMON,
            num_key_value_heads=2,
            max_position_embeddings=24,
            rope_scaling={"type": "dynamic", "factor": 4.0},
        ),
        40,
    ),
    "gpt_neox-partial": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(COMMON, hidden_size=128, rotary_pct=0.25, max_position_embeddings=64),
        40,
    ),
    "phi3-longrope-short": (
        "Phi3Config",
        "Phi3ForCausalLM",
        PHI3_LONGROPE,
        24,
    ),
    "phi3-longrope-long": (
        "Phi3Config",
        "Phi3ForCausalLM",
        PHI3_LONGROPE,
        48,
    ),
    # the families whose rotary module hands out each frequency twice in a row (interleaved pairs):
    # cohere2_moe was patched with the halves form and ran silently wrong
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(COMMON, num_key_value_heads=2, logit_scale=4.0), 40),
    "cohere2_moe": (
        "Cohere2MoeConfig",
        "Cohere2MoeForCausalLM",
        dict(COMMON, num_key_value_heads=2, logit_scale=4.0, eos_token_id=1),
        40,
    ),
    "gptj": (
        "GPTJConfig",
        "GPTJForCausalLM",
        {"vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 64},
        40,
    ),
}


def build(name):
    cfg_cls, model_cls, kwargs, seq = MODELS[name]
    config = getattr(transformers, cfg_cls)(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(1))
    return model, ids


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_transformers(name):
    model, ids = build(name)
    with torch.no_grad():
        want = model(ids).logits
        patch_model(model)
        assert any(hasattr(m, "posenc_rotary") for m in model.modules())
        got = model(ids).logits
        err = float((got - want).abs().max())
        print(f"{name}: max |logits diff| {err:.1e}")
        assert err <= LOGITS_TOL
        # a wrong rotary must show: the comparison can fail
        unpatch_model(model)
        settings = rotary_from_config(model.config)
        wrong = RotaryEmbedding(
            settings.head_dim, base=100.0, rotary_dim=settings.rotary_dim, layout=settings.layout
        )
        patch_model(model, rotary=wrong)
        assert float((model(ids).logits - want).abs().max()) > 10 * LOGITS_TOL
        unpatch_model(model)
        assert torch.equal(model(ids).logits, want)


@pytest.mark.parametrize("name", ["qwen2-dynamic", "phi3-longrope-long"])
def test_cached_decoding_matches_transformers(name):
    # transformers re-derives dynamic / longrope frequencies at every step from 1 + the largest position
    model, ids = build(name)
    ids = ids[:1]
    split = 16  # prefill inside the original context, decode past it
    with torch.no_grad():
        want = model(ids[:, :split], use_cache=True)
        want_steps = [want.logits[:, -1]]
        cache = want.past_key_values
        for t in range(split, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.past_key_values
            want_steps.append(out.logits[:, -1])
        model, _ = build(name)
        patch_model(model)
        out = model(ids[:, :split], use_cache=True)
        got_steps, cache = [out.logits[:, -1]], out.past_key_values
        for t in range(split, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.past_key_values
            got_steps.append(out.logits[:, -1])
    err = max(float((g - w).abs().max()) for g, w in zip(got_steps, want_steps, strict=True))
    assert err <= LOGITS_TOL


def hf_rotary(model):
    return next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))


@pytest.mark.parametrize("name", [n for n in MODELS if not n.startswith("gptj")])
def test_rotary_from_config_matches_the_model(name):
    model, _ = build(name)
    rot = rotary_from_config(model.config)
    hf = hf_rotary(model)
    from posenc.hf.handout import read_handout_form

    # the layout the module's hand-out form implies
    assert rot.layout == {"half": "half", "pairs": "interleaved"}[read_handout_form(hf)]
    np.testing.assert_allclose(rot.inv_freq.numpy(), hf.original_inv_freq.numpy(), rtol=2.5e-6)
    assert rot.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-12)
    # the config.json form gives the same module
    from_dict = rotary_from_config(model.config.to_dict())
    assert torch.equal(from_dict.inv_freq, rot.inv_freq) and from_dict.rotary_dim == rot.rotary_dim


def test_gptj_layout_and_rotary_dim():
    model, _ = build("gptj")
    rot = rotary_from_config(model.config)
    assert (rot.layout, rot.rotary_dim, rot.head_dim) == ("interleaved", 8, 16)
    sincos = hf_rotary(model).embed_positions[:40]
    sin, cos = rot.cos_sin(40)[1], rot.cos_sin(40)[0]
    assert torch.allclose(torch.cat((sin, cos), -1), sincos, atol=1e-5)


def test_llama31_config_json():
    # Llama 3.1 8B's published rope settings, typed here: no download
    raw = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    }
    rot = rotary_from_config(raw)
    config = transformers.LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    inv, attn = ROPE_INIT_FUNCTIONS["llama3"](config)
    np.testing.assert_allclose(rot.inv_freq.numpy(), inv.numpy(), rtol=2.5e-6)
    assert (rot.head_dim, rot.layout, attn) == (128, "half", 1.0)


def test_bad_configs():
    with pytest.raises(ValueError, match="config"):
        rotary_from_config(42)
    with pytest.raises(ValueError, match="rope_type"):
        rotary_from_config(
            {"model_type": "llama", "head_dim": 16, "rope_scaling": {"type": "warp", "factor": 2.0}}
        )
    with pytest.raises(ValueError, match="per-layer"):
        rotary_from_config(
            {
                "model_type": "x",
                "head_dim": 16,
                "rope_parameters": {"full_attention": {"rope_type": "default"}},
            }
        )
    with pytest.raises(ValueError, match="RotaryEmbedding"):
        patch_model(torch.nn.Linear(2, 2))


def test_importing_posenc_hf_does_not_import_transformers():
    import subprocess
    import sys

    code = "import sys, posenc, posenc.hf; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def decode_vs_full(model, ids, split, cache=None):
    """Worst |logits| difference between cached token-by-token decoding and a full forward at each length."""
    worst = 0.0
    with torch.no_grad():
        out = model(ids[:, :split], cache=cache, use_cache=True)
        cache = out.past_key_values
        for t in range(split, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.past_key_values
            full = model(ids[:, : t + 1]).logits[:, -1]
            worst = max(worst, float((out.logits[:, -1] - full).abs().max()))
    return worst


@pytest.mark.parametrize("name", ["qwen2-dynamic", "phi3-longrope-long"])
def test_consistent_cache_makes_decoding_equal_a_full_forward(name):
    cfg_cls, model_cls, kwargs, _ = MODELS[name]
    config = getattr(transformers, cfg_cls)(
        **{**kwargs, "num_hidden_layers": 1}
    )  # one layer: exact equality is possible
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # sharper attention, so a wrong key rotation shows in the logits
        for proj in (model.model.layers[0].self_attn,):
            for w in proj.parameters():
                w.mul_(4.0)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(1))
    stock = decode_vs_full(model, ids, 16)
    patch_model(model)
    patched = decode_vs_full(model, ids, 16)
    fixed = decode_vs_full(model, ids, 16, consistent_cache(model))
    print(
        f"{name}: decode vs full forward, stock {stock:.1e}, patched {patched:.1e}, consistent cache "
        f"{fixed:.1e}"
    )
    assert stock > 1e-3 and patched > 1e-3  # transformers' semantics, kept by patch_model
    assert fixed <= LOGITS_TOL


def test_a_config_without_rotary_embedding_is_refused_by_name():
    from transformers import BertConfig, GPT2Config

    for config in (
        GPT2Config(),
        BertConfig(),
        {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4},
    ):
        with pytest.raises(ValueError, match=r"describes no rotary embedding"):
            rotary_from_config(config)
    # an early Llama config.json names no theta: still RoPE, with the default base
    legacy = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
    assert rotary_from_config(legacy).base == 10000.0


@pytest.mark.parametrize(
    "rotary, message",
    [
        ("rope", "rotary must be a posenc.RotaryEmbedding or None, got str"),
        (posenc.XPos(16, layout="half"), r"rotary=XPos\(...\) does more than rotate"),
        (
            RotaryEmbedding(16, layout="interleaved"),
            "rotary has layout='interleaved', but the model's .* needs layout='half'",
        ),
        (RotaryEmbedding(32, layout="half"), "rotary has head_dim=32, but the model's .* needs head_dim=16"),
        (RotaryEmbedding(16, rotary_dim=8, layout="half"), "rotary has rotary_dim=8, .* needs rotary_dim=16"),
    ],
)
def test_a_rotary_the_model_cannot_take_is_refused_and_nothing_is_patched(rotary, message):
    """A rotary that the model's cos/sin cannot carry (xPos's scale, another pairing or width) used to be
    accepted and run as something else, or crash at the first forward."""
    model, ids = build("llama-yarn")
    with torch.no_grad():
        want = model(ids).logits
        with pytest.raises(ValueError, match=message):
            patch_model(model, rotary=rotary)
        assert not any(hasattr(m, "posenc_rotary") for m in model.modules())
        assert torch.equal(model(ids).logits, want)


def test_consistent_cache_keeps_half_precision_keys_from_drifting():
    """Dynamic NTK changes the schedule at every step past the original context; turning bfloat16 keys
    again and again rounded them again each time. After 200 steps the cached keys must still be the keys a
    single forward pass over the same tokens caches, to bfloat16 rounding."""
    cfg_cls, model_cls, kwargs, _ = MODELS["qwen2-dynamic"]
    config = getattr(transformers, cfg_cls)(**{**kwargs, "num_hidden_layers": 1})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval().to(torch.bfloat16)
    patch_model(model)
    ids = torch.randint(0, 128, (1, 208), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = consistent_cache(model)
        model(ids[:, :8], cache=cache, use_cache=True)
        for t in range(8, 208):
            model(ids[:, t : t + 1], cache=cache, use_cache=True)
        full = model(ids, use_cache=True).past_key_values
    drift = (cache.layers[0].keys.float() - full.layers[0].keys.float()).abs().max().item()
    scale = full.layers[0].keys.float().abs().max().item()
    assert drift <= 2 * scale * 2**-8, f"cached keys drifted by {drift:.3g} (keys up to {scale:.3g})"


NARROW_AND_COMPLEX = {
    "gpt_oss": (  # (cos, sin) at half width
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(COMMON, num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1),
    ),
    "deepseek_v2": (  # complex freqs_cis
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            COMMON,
            num_key_value_heads=4,
            moe_intermediate_size=32,
            n_routed_experts=2,
            num_experts_per_tok=1,
            kv_lora_rank=16,
            q_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    ),
    "codegen": (  # (sin, cos) at half width from a table, float32, over a partial rotary
        "CodeGenConfig",
        "CodeGenForCausalLM",
        dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256),
    ),
}


@pytest.mark.parametrize("name", sorted(NARROW_AND_COMPLEX))
def test_narrow_and_complex_handouts_are_reproduced(name):
    """GPT-OSS, DeepSeek-V2 and CodeGen were accepted and crashed at the first forward, then refused: their
    rotary modules hand out half-width (cos, sin), e^(i angle), or (sin, cos). posenc now hands out each in
    its own form, checked against the module's own before patching."""
    from posenc.tools.zoo import _sabotage

    cfg_cls, model_cls, kwargs = NARROW_AND_COMPLEX[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kwargs)).eval()
    ids = torch.randint(3, 100, (1, 16))
    with torch.no_grad():
        want = model(ids).logits
    patch_model(model)
    _sabotage(model)  # transformers' own rotary modules now hand out wrong cos/sin
    with torch.no_grad():
        assert (model(ids).logits - want).abs().max() < LOGITS_TOL


def test_glm4v_m_rope_is_applied_with_three_differing_axes():
    """GLM-4V was accepted and crashed at the first forward (its rotary module reads (3, batch, seq) M-RoPE
    position ids), then refused; it now takes Qwen2-VL's contiguous sections over its partial rotary."""
    from posenc.tools.zoo import _axis_positions, _sabotage

    rope = {
        "rope_type": "default",
        "rope_theta": 1e4,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1],
    }
    config = transformers.Glm4vTextConfig(**COMMON, num_key_value_heads=2, rope_parameters=rope)
    torch.manual_seed(0)
    model = transformers.Glm4vTextModel(config).eval()
    ids, axes = torch.randint(3, 100, (1, 12)), _axis_positions(12)
    with torch.no_grad():
        want = model(ids, position_ids=axes).last_hidden_state
    patch_model(model)
    _sabotage(model)
    with torch.no_grad():
        assert (model(ids, position_ids=axes).last_hidden_state - want).abs().max() < LOGITS_TOL


def test_m_rope_families_outside_the_plans_are_refused_when_patched():
    """HunYuan-VL's language model reads XD-RoPE position ids of four axes, and its two halves of a pair
    can turn by different axes' angles (no rotation per pair); patch_model refuses it before patching
    anything."""
    from posenc.tools import zoo

    model = zoo._model_class("hunyuan_vl_text")(zoo.tiny_config("hunyuan_vl_text"))
    with pytest.raises(ValueError, match="takes M-RoPE position ids of several axes.*'hunyuan_vl_text'"):
        patch_model(model)
    assert not any(hasattr(m, "posenc_rotary") for m in model.modules())


def test_a_rotary_module_with_one_rope_per_layer_type_gets_one_per_type_and_unpatches():
    """OLMo 3's rotary module keeps a RoPE per layer type (forward(x, position_ids, layer_type)); it was
    refused as an unknown hand-out. Sliding layers at base 1e4, full ones at 5e5 with YaRN."""
    from posenc.tools.zoo import _sabotage

    config = transformers.Olmo3Config(
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 5e5,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    )
    torch.manual_seed(0)
    model = transformers.Olmo3ForCausalLM(config).eval()
    ids = torch.randint(3, 100, (1, 24))
    with torch.no_grad():
        want = model(ids).logits
    with pytest.raises(ValueError, match="one per layer type"):
        patch_model(model, rotary=RotaryEmbedding(16, layout="half"))
    patch_model(model)
    rotaries = model.model.rotary_emb.posenc_rotary
    assert sorted(rotaries) == ["full_attention", "sliding_attention"]
    assert (
        rotaries["full_attention"].base == 5e5 and rotaries["full_attention"].scaling["rope_type"] == "yarn"
    )
    _sabotage(model)  # transformers' own cos/sin would now be wrong: posenc's are what the model uses
    with torch.no_grad():
        assert (model(ids).logits - want).abs().max() < LOGITS_TOL
    unpatch_model(model)
    assert not hasattr(model.model.rotary_emb, "posenc_forwards")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_a_query_temperature_the_model_applies_itself_stays_with_it():
    """Ministral 3 scales queries by 1 + beta ln(1 + floor(p / L0)) in its attention code, from the position
    ids; patch_model gives the cos/sin and leaves that to the model (it was refused for the unknown key).
    rotary_from_config still refuses the key: a RotaryEmbedding alone cannot carry a temperature."""
    from posenc.tools.zoo import _sabotage

    rope = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "llama_4_scaling_beta": 0.5,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }
    config = transformers.Ministral3Config(**COMMON, head_dim=16, num_key_value_heads=2, rope_parameters=rope)
    torch.manual_seed(0)
    model = transformers.Ministral3ForCausalLM(config).eval()
    ids = torch.randint(3, 100, (1, 40))  # positions past 8, 16 and 24: the temperature grows
    with torch.no_grad():
        want = model(ids).logits
    patch_model(model)
    _sabotage(model)
    with torch.no_grad():
        assert (model(ids).logits - want).abs().max() < LOGITS_TOL
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        rotary_from_config(config)


def test_a_rotary_is_refused_where_posenc_cannot_reproduce_the_models_own():
    """rotary= reaches the model through the hand-out form read off its own rotary module; where posenc does
    not reproduce that module's own cos/sin, a rotary passed in is refused too (it was accepted unchecked)."""
    model, _ = build("qwen2")
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_theta": 123.0}  # not the module's
    with pytest.raises(ValueError, match="not what the model computes itself"):
        patch_model(model, rotary=RotaryEmbedding(16, layout="half"))
    assert not any(hasattr(m, "posenc_rotary") for m in model.modules())
