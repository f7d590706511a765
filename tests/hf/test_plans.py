"""patch_model with per-layer position plans: tiny random models of each family give the same outputs with
posenc computing their positions as without, for a prefill and for token-by-token decoding with the
model's cache; a deliberately wrong plan changes them by far more than rounding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc.hf import patch_model, position_plan, unpatch_model

from .families import TOL, build, decode, max_diff, output

WRONG = 1e-3  # a wrong plan must move the outputs by at least this: 100x the parity tolerance


def ids_for(seed: int = 1, batch: int = 2, seq: int = 24) -> torch.Tensor:
    return torch.randint(3, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


def every_layer(plan, **changes):
    return tuple(dataclasses.replace(lp, **changes) for lp in plan)


def rope_everywhere(plan):
    rope = next(lp.rope for lp in plan if lp.rope is not None)
    return every_layer(plan, rope=rope, temperature=None)


def wrong_plans(name, plan):
    """A plausible mistake per family: what an engine reading the config naively would do."""
    if name == "llama4-no-temperature":  # iRoPE's NoPE layers without their query temperature
        return every_layer(plan, temperature=None)
    if name == "gemma3":  # one RoPE for all layers: the global base and scaling on sliding layers too
        return every_layer(plan, rope=plan[1].rope)
    if name == "gemma4":  # "proportional" read as plain RoPE: every pair of the global head rotating
        whole = dataclasses.replace(plan[1].rope, scaling=())
        return tuple(dataclasses.replace(lp, rope=whole) if lp.attention == "full" else lp for lp in plan)
    if name in ("llama4", "smollm3"):  # RoPE on every layer (no_rope_layers read the wrong way round)
        return rope_everywhere(plan)
    if name == "cohere2":  # no RoPE at all
        return every_layer(plan, rope=None)
    if name == "deepseek_v3":  # YaRN's mscale_all_dim left out of the softmax scale
        return every_layer(plan, scale=16**-0.5)
    raise KeyError(name)


CASES = ["gemma3", "gemma4", "llama4", "llama4-no-temperature", "smollm3", "cohere2", "deepseek_v3"]


@pytest.mark.parametrize("name", CASES)
def test_prefill_and_decoding_match_transformers(name):
    model, config = build(name.split("-")[0])
    ids = ids_for()
    with torch.no_grad():
        want, want_steps = output(model, input_ids=ids), decode(model, ids, 12)
        patch_model(model)
        got, got_steps = output(model, input_ids=ids), decode(model, ids, 12)
        unpatch_model(model)
        wrong = wrong_plans(name, position_plan(config))
        patch_model(model, plan=wrong)
        bad, bad_steps = output(model, input_ids=ids), decode(model, ids, 12)
        unpatch_model(model)
        again = output(model, input_ids=ids)
    prefill, steps = max_diff(got, want), max_diff(got_steps, want_steps)
    wrong_prefill, wrong_steps = max_diff(bad, want), max_diff(bad_steps, want_steps)
    print(
        f"{name}: prefill {prefill:.1e}, decode {steps:.1e}, "
        f"wrong plan {wrong_prefill:.1e} / {wrong_steps:.1e}"
    )
    assert prefill <= TOL and steps <= TOL
    assert wrong_prefill > WRONG and wrong_steps > WRONG
    assert torch.equal(again, want)


def test_gemma4_kv_shared_layers_on_the_last_tokens():
    # with logits_to_keep, Gemma 4 runs its KV-shared layers on the last tokens only
    model, _ = build("gemma4")
    ids = ids_for()
    with torch.no_grad():
        want = model(input_ids=ids, logits_to_keep=3).logits
        patch_model(model)
        got = model(input_ids=ids, logits_to_keep=3).logits
        unpatch_model(model)
    assert got.shape == (2, 3, 128) and max_diff(got, want) <= TOL
