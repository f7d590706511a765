"""patch_model(model, plan=...) beyond the families with a per-layer plan of their own: a single-RoPE family
takes a plan in its rotary module's hand-out form (or refuses it before any change), and a query temperature
goes after a layer's query norm, where one would otherwise undo it."""

import dataclasses

import pytest
import torch
import transformers

from posenc.hf import QueryTemperature, patch_model, position_plan, unpatch_model
from posenc.hf.ledger import is_patched
from posenc.rope import RotaryEmbedding

from .families import build, max_diff


def _llama(layers: int = 3):
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), config


def test_a_llama_given_its_own_plan_is_the_unpatched_model_and_one_rope_is_rotary():
    model, config = _llama()
    ids = torch.randint(0, 64, (1, 40))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        patch_model(model, plan=position_plan(config))
        own = model(input_ids=ids).logits
        unpatch_model(model)
        plan = tuple(
            dataclasses.replace(lp, rope=dataclasses.replace(lp.rope, base=500.0))
            for lp in position_plan(config)
        )
        patch_model(model, plan=plan)
        planned = model(input_ids=ids).logits
        unpatch_model(model)
        patch_model(model, rotary=RotaryEmbedding(16, base=500.0, layout="half"))
        one = model(input_ids=ids).logits
        unpatch_model(model)
    assert max_diff(own, plain) < 1e-5
    assert max_diff(planned, one) < 1e-5 and max_diff(planned, plain) > 1e-3


def test_a_layer_without_rope_in_a_llama_plan_is_its_nope_layer():
    """Layer 1 without RoPE: the model equals one whose layer 1 rotates by the identity (base so large that
    every angle is 0 below the tested positions is not it: compare with cos 1, sin 0 handed in directly)."""
    model, config = _llama()
    ids = torch.randint(0, 64, (1, 24))
    plan = list(position_plan(config))
    plan[1] = dataclasses.replace(plan[1], rope=None)
    with torch.no_grad():
        patch_model(model, plan=tuple(plan))
        got = model(input_ids=ids).logits
        unpatch_model(model)
        layer = model.model.layers[1].self_attn

        def identity(module, args, kwargs):
            cos, sin = kwargs["position_embeddings"]
            kwargs["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
            return args, kwargs

        handle = layer.register_forward_pre_hook(identity, with_kwargs=True)
        want = model(input_ids=ids).logits
        handle.remove()
    assert max_diff(got, want) < 1e-5


@pytest.mark.parametrize("family", ["gptj", "gpt_neox"])
def test_a_family_whose_hand_out_a_plan_cannot_take_is_refused_unchanged(family):
    if family == "gptj":
        config = transformers.GPTJConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4)
        model = transformers.GPTJForCausalLM(config).eval()
    else:
        config = transformers.GPTNeoXConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
        )
        model = transformers.GPTNeoXForCausalLM(config).eval()
    with pytest.raises(ValueError, match=f"{config.model_type}'s rotary modules hand out narrow"):
        patch_model(model, plan=position_plan(config))
    assert not is_patched(model)


def test_a_query_temperature_scales_the_queries_after_their_norm():
    """Gemma 3 normalises its queries (q_norm) after q_proj: the plan's temperature multiplies q_norm's
    output, which a hand-made hook on q_norm reproduces."""
    model, config = build("gemma3")
    temperature = QueryTemperature(attn_scale=0.5, floor_scale=4.0)
    plan = list(position_plan(config))
    plan[1] = dataclasses.replace(plan[1], temperature=temperature)
    ids = torch.randint(0, 100, (2, 30))
    with torch.no_grad():
        patch_model(model, plan=tuple(plan))
        got = model(input_ids=ids).logits
        unpatch_model(model)
        scales = temperature(torch.arange(30))  # (seq,): queries (batch, heads, seq, head_dim)

        def scaled(module, args, output):
            return output * scales[:, None]

        patch_model(model)
        handle = model.model.layers[1].self_attn.q_norm.register_forward_hook(scaled)
        want = model(input_ids=ids).logits
        handle.remove()
        unpatch_model(model)
        plain = model(input_ids=ids).logits
    assert max_diff(got, want) < 1e-5 and max_diff(got, plain) > 1e-3
