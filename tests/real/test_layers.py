"""Layer-selective methods (posenc.real.layers, posenc.real.methods.treatment): layer sets, method specs, the
plans they give and how each runs the model."""

import math

import pytest
import torch
import transformers
from hypothesis import given
from hypothesis import strategies as st

from posenc.extension import METHODS, extension_scaling
from posenc.hf import patch_model, position_plan, unpatch_model
from posenc.real.layers import LogLengthTemperature, Part, layer_indices, method_plan, parse_method
from posenc.real.methods import method_rotary, treatment
from posenc.rope import RotaryEmbedding

GEMMA = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "hidden_size": 64,
    "sliding_window": 16,
    "max_position_embeddings": 256,
    "layer_types": ["sliding_attention"] * 5
    + ["full_attention"]
    + ["sliding_attention"] * 5
    + ["full_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
}
LLAMA = {"model_type": "llama", "num_hidden_layers": 8, "num_attention_heads": 4, "hidden_size": 64,
         "max_position_embeddings": 256, "rope_theta": 1e4}  # fmt: skip


def test_layer_sets_name_the_layers_a_person_would_expect():
    gemma, llama = position_plan(GEMMA), position_plan(LLAMA)
    assert layer_indices("global", gemma) == (5, 11)
    assert layer_indices("sliding", gemma) == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert layer_indices("all", gemma) == tuple(range(12))
    assert layer_indices("every:4", llama) == (3, 7)  # SmolLM3's NoPE layers: every fourth
    assert layer_indices("0,5,2", gemma) == (0, 2, 5)
    assert layer_indices("global", llama) == tuple(range(8))  # no sliding layers: every layer is global


@pytest.mark.parametrize(
    "layer_set, message",
    [
        ("0,12", "this model has layers 0..11, not 12"),
        ("1,1", "names a layer twice"),
        ("every:0", "every:K needs a positive integer K"),
        ("first", "is not a layer set; allowed: global, sliding, all, every:K"),
        ("sliding", "names no layer with RoPE"),
    ],
)
def test_a_bad_layer_set_is_refused_naming_the_flag(layer_set, message):
    plan = position_plan(GEMMA if layer_set != "sliding" else LLAMA)
    with pytest.raises(ValueError, match=f"--layers {layer_set}.*{message}"):
        layer_indices(layer_set, plan)


def test_method_specs_parse_into_parts_and_refuse_what_cannot_run():
    assert parse_method("yarn") == (Part("yarn"),)
    assert parse_method("pi+nope-global@every:4") == (Part("pi"), Part("nope-global", "every:4"))
    assert parse_method("yarn@5/11") == (Part("yarn", "5,11"),)
    assert str(Part("yarn", "5,11")) == "yarn@5/11"
    for spec, message in [
        ("foo", "unknown method 'foo'"),
        ("yarn@", "'@' needs a layer set"),
        ("selfextend@global", "selfextend remaps distances in every layer's attention"),
        ("yarn+rerope", "rerope remaps distances"),
        ("", "is empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_method(spec)


def test_a_frequency_method_scales_only_its_layers():
    base = position_plan(GEMMA)
    plan = method_plan(base, parse_method("yarn"), factor=4.0, train_len=256, layers="global")
    want = dict(extension_scaling("yarn", 4.0, 256))
    for lp, before in zip(plan, base, strict=True):
        if lp.layer in (5, 11):
            assert dict(lp.rope.scaling) == want and lp.rope.base == 1e6
            assert lp.rope.max_position_embeddings == 256
        else:
            assert lp == before  # the sliding layers as trained
    every = method_plan(base, parse_method("yarn@all"), factor=4.0, train_len=256, layers="global")
    assert all(dict(lp.rope.scaling) == want for lp in every)
    assert [lp.rope.base for lp in every] == [lp.rope.base for lp in base]


def test_at_factor_one_a_method_that_is_the_identity_there_leaves_the_plan_unchanged():
    base = position_plan(GEMMA)
    for name, method in METHODS.items():
        if method.identity_at_one:
            assert method_plan(base, parse_method(name), factor=1.0, train_len=256, layers="all") == tuple(
                lp.__class__(**{**lp.__dict__, "rope": lp.rope.__class__(**{**lp.rope.__dict__,
                                 "max_position_embeddings": 256})})
                for lp in base
            )  # fmt: skip


def test_layer_conversions_take_rope_away_and_mixes_share_no_layer():
    base = position_plan(GEMMA)
    plan = method_plan(base, parse_method("nope-global-temp"), factor=2.0, train_len=256, layers="global")
    assert [lp.layer for lp in plan if lp.rope is None] == [5, 11]
    assert plan[5].temperature == LogLengthTemperature(256) and plan[0].temperature is None
    mixed = method_plan(base, parse_method("pi@sliding+nope-global"), factor=2.0, train_len=256, layers="all")
    assert [lp.rope is None for lp in mixed] == [i in (5, 11) for i in range(12)]
    assert all(dict(lp.rope.scaling)["rope_type"] == "linear" for lp in mixed if lp.rope is not None)
    with pytest.raises(ValueError, match="layer 5 is in both pi's and nope-global's layers"):
        method_plan(base, parse_method("pi@all+nope-global"), factor=2.0, train_len=256, layers="all")


@given(st.integers(0, 10**6), st.integers(2, 1 << 20))
def test_the_log_length_temperature_is_one_inside_the_trained_length_and_its_log_ratio_past_it(p, n):
    scale = float(LogLengthTemperature(n)(torch.tensor([p]))[0])
    want = max(1.0, math.log(p + 1) / math.log(n))
    assert scale == pytest.approx(want, rel=1e-6)
    assert (scale == 1.0) == (p + 1 <= n)


def test_a_single_rope_model_keeps_one_rope_unless_a_method_names_layers():
    same = treatment(LLAMA, "yarn", factor=2.0, train_len=256, longest=512)
    assert (
        same.plan is None
        and same.rotary.scaling == method_rotary(LLAMA, "yarn", factor=2.0, train_len=256).scaling
    )
    remap = treatment(LLAMA, "selfextend", factor=2.0, train_len=256, longest=512)
    assert remap.plan is None and remap.remap is not None
    some = treatment(LLAMA, "yarn@every:4", factor=2.0, train_len=256, longest=512)
    assert some.plan is not None and [lp.rope.scaling != () for lp in some.plan] == [
        i in (3, 7) for i in range(8)
    ]
    planned = treatment(GEMMA, "none", factor=2.0, train_len=256, longest=512)
    assert planned.plan == position_plan(GEMMA)
    with pytest.raises(ValueError, match="gemma3_text has a per-layer plan"):
        treatment(GEMMA, "selfextend", factor=2.0, train_len=256, longest=512)


def test_treatments_that_run_the_model_alike_share_a_digest_and_others_do_not():
    def digest(config, spec, factor=2.0):
        return treatment(config, spec, factor=factor, train_len=256, longest=512).digest(512)

    assert digest(LLAMA, "yarn", 1.0) == digest(LLAMA, "none", 1.0)  # YaRN is the identity at factor 1
    assert digest(GEMMA, "yarn", 1.0) == digest(GEMMA, "none", 1.0)
    assert (
        len({digest(GEMMA, s) for s in ("none", "yarn", "yarn@all", "nope-global", "nope-global-temp")}) == 5
    )


def test_a_plan_on_a_single_rope_model_is_exact_against_its_one_rope():
    """plan= on a Llama: every layer's cos/sin from posenc, equal to rotary= with the same RoPE."""
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 48))
    t = treatment(config, "pi@all", factor=2.0, train_len=32, longest=64)
    assert t.plan is not None
    with torch.no_grad(), t.applied(model):
        planned = model(input_ids=ids).logits
    rotary = RotaryEmbedding(
        16, layout="half", scaling=extension_scaling("pi", 2.0, 32), max_position_embeddings=32
    )
    patch_model(model, rotary=rotary)
    with torch.no_grad():
        one = model(input_ids=ids).logits
    unpatch_model(model)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    assert (planned - one).abs().max() < 1e-5 and (planned - plain).abs().max() > 1e-3
