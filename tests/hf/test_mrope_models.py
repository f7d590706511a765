"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL language models with image and video grids in the sequence: the
(3, batch, seq) positions transformers computes, with left padding, give the same outputs with posenc's
M-RoPE as with transformers', for a prefill and while decoding; the other slot order does not."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc.hf import patch_model, position_plan, unpatch_model
from posenc.rope.mrope import mrope_decode_positions

from . import families
from .families import TOL, build, max_diff
from .vl import hf_rope_index, layout

WRONG = 1e-3
FLIPPED = {"interleaved": "contiguous", "contiguous": "interleaved"}
# Qwen2.5-VL: 1.5 s per temporal grid step at 2 tokens per second, so frames sit 3 positions apart
SECONDS = torch.tensor([1.5, 1.5])


def run(model, ids, mask, positions, deltas, steps: int = 4):
    """Prefill output, then ``steps`` cached decoding steps' last outputs."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    outs, cache = [out.last_hidden_state], out.cache
    seen = mask.sum(-1)
    for t in range(steps):
        mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=-1)
        nxt = torch.full((ids.shape[0], 1), 5 + t)
        pos = mrope_decode_positions(deltas, seen + t)
        out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        outs.append(out.last_hidden_state)
        cache = out.cache
    return outs


def real(x, mask):
    """Outputs at real (not padding) tokens only: padding rows attend to nothing and are arbitrary."""
    return x[mask.bool()] if x.shape[1] == mask.shape[1] else x


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_multimodal_positions_match_transformers(family):
    model, config = build(family)
    types_, mask, images, videos = layout(family)
    positions, deltas = hf_rope_index(
        family, types_, mask=mask, images=images, videos=videos, seconds=SECONDS
    )
    ids = torch.randint(3, 128, types_.shape, generator=torch.Generator().manual_seed(1))
    plan = position_plan(config)
    flipped = tuple(
        dataclasses.replace(lp, rope=dataclasses.replace(lp.rope, mrope_order=FLIPPED[lp.rope.mrope_order]))
        for lp in plan
    )
    text = torch.arange(ids.shape[1]).expand(3, 1, -1)
    with torch.no_grad():
        want = run(model, ids, mask, positions, deltas)
        want_text = model(input_ids=ids[:1], position_ids=text).last_hidden_state
        patch_model(model)
        got = run(model, ids, mask, positions, deltas)
        unpatch_model(model)
        patch_model(model, plan=flipped)
        bad = run(model, ids, mask, positions, deltas)
        bad_text = model(input_ids=ids[:1], position_ids=text).last_hidden_state
        unpatch_model(model)
    prefill = max_diff(real(got[0], mask), real(want[0], mask))
    steps = max_diff(got[1:], want[1:])
    wrong, wrong_steps = max_diff(real(bad[0], mask), real(want[0], mask)), max_diff(bad[1:], want[1:])
    print(
        f"{family}: prefill {prefill:.1e}, decode {steps:.1e}, "
        f"other slot order {wrong:.1e} / {wrong_steps:.1e}"
    )
    assert prefill <= TOL and steps <= TOL
    assert wrong > WRONG and wrong_steps > WRONG
    # text alone cannot tell the two slot orders apart: all three axes carry the same position
    assert max_diff(bad_text, want_text) <= TOL


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_dynamic_ntk_over_three_axes_matches_transformers(family, monkeypatch):
    # trained at 8 positions, so the grids' positions reach past it: transformers takes dynamic NTK's length
    # as 1 + the largest position id on any axis, growing as decoding goes on
    cfg_cls, model_cls, kwargs = families.FAMILIES[family]
    params = {**kwargs["rope_parameters"], "rope_type": "dynamic", "factor": 2.0}
    monkeypatch.setitem(
        families.FAMILIES,
        family,
        (cfg_cls, model_cls, {**kwargs, "rope_parameters": params, "max_position_embeddings": 8}),
    )
    model, _ = build(family)
    types_, mask, images, videos = layout(family)
    positions, deltas = hf_rope_index(
        family, types_, mask=mask, images=images, videos=videos, seconds=SECONDS
    )
    assert int(positions.max()) + 1 > 8  # the schedule is scaled
    ids = torch.randint(3, 128, types_.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = run(model, ids, mask, positions, deltas)
        patch_model(model)
        got = run(model, ids, mask, positions, deltas)
        unpatch_model(model)
    assert max_diff(real(got[0], mask), real(want[0], mask)) <= TOL
    assert max_diff(got[1:], want[1:]) <= TOL
