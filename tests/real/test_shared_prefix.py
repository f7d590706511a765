"""Attention over a shared prefix (posenc.hf.shared_prefix): each row of a batch attends as if its own
tokens followed the prefix in one sequence, against torch's SDPA with an explicit mask and against
posenc.remap.remap_attention on that sequence, row by row."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.hf.shared_prefix import IMPLEMENTATION, Rows, _attend, _Keys, _shared_forward, can_share
from posenc.remap import NoRemap, ReRoPE, SelfExtend, remap_attention
from posenc.rope import RotaryEmbedding

HEAD_DIM = 16


def _case(seed: int, real: list[int], queries: int, kept: int, length: int, first_step: bool):
    """q (rows, 6, queries, HEAD_DIM) and the keys: a prefix of ``length`` tokens whose last ``kept`` a layer
    holds, then row r's ``real[r]`` own tokens after it in slots padded to the longest. ``first_step``: the
    queries are every slot, padding after each row's tokens (a batch's first forward); else the queries are
    each row's last ``queries`` tokens, its padding before them (a decoding step). Returns q, the keys, and
    per row the slots of its tokens in order and the query slots to compare."""
    g = torch.Generator().manual_seed(seed)
    rows, hk, width = len(real), 2, max(real) + (0 if first_step else 1)
    # padding where a batch puts it, slot t at position length + t: in reach of the queries, never seen
    positions = torch.arange(length, length + width).repeat(rows, 1)
    valid = torch.zeros(rows, width, dtype=torch.bool)
    slots = []
    for r, n in enumerate(real):
        mine = (
            list(range(n)) if first_step else list(range(n - queries)) + list(range(width - queries, width))
        )
        positions[r, mine] = torch.arange(length, length + n)
        valid[r, mine] = True
        slots.append(mine)
    at = positions if first_step else positions[:, -queries:]
    keys = _Keys(
        torch.randn(1, hk, kept, HEAD_DIM, generator=g),
        torch.randn(1, hk, kept, HEAD_DIM, generator=g),
        torch.randn(rows, hk, width, HEAD_DIM, generator=g),
        torch.randn(rows, hk, width, HEAD_DIM, generator=g),
        length,
        Rows(at, positions, valid),
    )
    q = torch.randn(rows, hk * 3, at.shape[1], HEAD_DIM, generator=g)
    compared = [list(range(n)) if first_step else list(range(queries)) for n in real]
    return q, keys, slots, compared


def _row_keys(keys: _Keys, r: int, slots: list[int]):
    """Row r's keys as one sequence: the prefix's, then its own tokens'."""
    return (
        torch.cat((keys.prefix_k[0], keys.own_k[r][:, slots]), dim=-2)[None],
        torch.cat((keys.prefix_v[0], keys.own_v[r][:, slots]), dim=-2)[None],
    )


LAYOUTS = dict(
    seed=st.integers(0, 10**6),
    real=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    queries=st.integers(1, 3),
    kept=st.integers(1, 24),
    dropped=st.integers(0, 10),
    first_step=st.booleans(),
)


@settings(max_examples=30, deadline=None)
@given(window=st.one_of(st.none(), st.integers(1, 30)), **LAYOUTS)
def test_plain_rows_equal_sdpa_on_their_own_sequence(seed, real, queries, kept, dropped, first_step, window):
    queries = min(queries, min(real))
    q, keys, slots, compared = _case(seed, real, queries, kept, kept + dropped, first_step)
    scale = 0.3
    got = _attend(q, keys, keys.rows.queries, None, NoRemap(), scale, window)
    for r, mine in enumerate(slots):
        k, v = _row_keys(keys, r, mine)
        j = torch.arange(keys.length - kept, keys.length + len(mine))
        i = j[-len(mine) :] if first_step else j[-queries:]
        allowed = (j[None] <= i[:, None]) & (True if window is None else (i[:, None] - j[None] < window))
        rows = q[r : r + 1, :, : len(mine)] if first_step else q[r : r + 1]
        expected = torch.nn.functional.scaled_dot_product_attention(
            rows, k, v, attn_mask=allowed, scale=scale, enable_gqa=True
        )
        # a row whose window holds no key of the prefix is still exact: its own token is always there
        torch.testing.assert_close(got[r : r + 1, :, compared[r]], expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "remap,window",
    [(SelfExtend(group_size=3, window=5), None), (ReRoPE(window=4), None), (ReRoPE(window=4), 9)],
)
@pytest.mark.parametrize("first_step", [True, False])
def test_remapped_rows_equal_remap_attention_on_their_own_sequence(remap, window, first_step):
    rotary = RotaryEmbedding(HEAD_DIM, base=10000.0, layout="half", max_position_embeddings=4096)
    q, keys, slots, compared = _case(7, [6, 3, 5], 2, 40, 40, first_step)
    keys = dataclasses.replace(keys, memo={})  # the prefix's rotated keys kept: the second call reads them
    got = _attend(q, keys, keys.rows.queries, rotary, remap, 1 / math.sqrt(HEAD_DIM), window)
    assert len(keys.memo) == 2
    again = _attend(q, keys, keys.rows.queries, rotary, remap, 1 / math.sqrt(HEAD_DIM), window)
    torch.testing.assert_close(again, got)
    for r, mine in enumerate(slots):
        k, v = _row_keys(keys, r, mine)
        rows = q[r : r + 1, :, : len(mine)] if first_step else q[r : r + 1]
        expected = remap_attention(rows, k, v, rotary, remap, kernel="blocks", window=window, offset=0)
        torch.testing.assert_close(got[r : r + 1, :, compared[r]], expected, atol=2e-5, rtol=1e-5)


def test_outside_its_context_the_implementation_refuses():
    q, keys, _, _ = _case(0, [1], 1, 4, 4, True)
    with pytest.raises(ValueError, match=f"{IMPLEMENTATION}.*runs only inside shared_prefix"):
        _shared_forward(None, q, keys.own_k, keys.own_v, None)


def test_what_it_cannot_reproduce_is_named(smollm2):
    assert can_share(smollm2.model) is None
    config = smollm2.model.config
    kept = config._attn_implementation
    try:
        config._attn_implementation = "flex_attention"
        assert "flex_attention" in can_share(smollm2.model)
    finally:
        config._attn_implementation = kept


def test_a_model_in_half_precision_answers_one_question_at_a_time(fresh_smollm2):
    model = fresh_smollm2.model.to(torch.bfloat16)
    assert "torch.bfloat16" in can_share(model)
