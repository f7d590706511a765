"""Attention over a shared prefix (posenc.real.shared_prefix): each row of a batch attends as if its own
tokens followed the prefix in one sequence, against torch's SDPA with an explicit mask and against
posenc.remap.remap_attention on that sequence, row by row."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.real.shared_prefix import IMPLEMENTATION, _attend, _Keys, _shared_forward, can_share
from posenc.remap import NoRemap, ReRoPE, SelfExtend, remap_attention
from posenc.rope import RotaryEmbedding

HEAD_DIM = 16


def _case(seed: int, rows: int, queries: int, own: int, kept: int, length: int, groups: int = 3):
    """q (rows, 2 * groups, queries, HEAD_DIM) and the keys: a prefix of ``length`` tokens whose last
    ``kept`` a layer holds, then ``own`` tokens of each row, the last ``queries`` of them the queries'."""
    g = torch.Generator().manual_seed(seed)
    hk = 2
    q = torch.randn(rows, hk * groups, queries, HEAD_DIM, generator=g)
    keys = _Keys(
        torch.randn(1, hk, kept, HEAD_DIM, generator=g),
        torch.randn(1, hk, kept, HEAD_DIM, generator=g),
        torch.randn(rows, hk, own, HEAD_DIM, generator=g),
        torch.randn(rows, hk, own, HEAD_DIM, generator=g),
        length,
    )
    return q, keys


def _row_keys(keys: _Keys, r: int):
    return (
        torch.cat((keys.prefix_k[0], keys.own_k[r]), dim=-2)[None],
        torch.cat((keys.prefix_v[0], keys.own_v[r]), dim=-2)[None],
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    rows=st.integers(1, 4),
    queries=st.integers(1, 5),
    extra=st.integers(0, 6),
    kept=st.integers(1, 24),
    dropped=st.integers(0, 10),
    window=st.one_of(st.none(), st.integers(1, 30)),
)
def test_plain_rows_equal_sdpa_on_their_own_sequence(seed, rows, queries, extra, kept, dropped, window):
    q, keys = _case(seed, rows, queries, queries + extra, kept, kept + dropped)
    own, scale = keys.own_k.shape[-2], 0.3
    first = keys.length + own - queries
    got = _attend(q, keys, first, None, NoRemap(), scale, window)
    j = keys.positions()
    i = torch.arange(first, first + queries)
    allowed = (j[None] <= i[:, None]) & (True if window is None else (i[:, None] - j[None] < window))
    for r in range(rows):
        k, v = _row_keys(keys, r)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[r : r + 1], k, v, attn_mask=allowed, scale=scale, enable_gqa=True
        )
        # a row whose window holds no key of the prefix is still exact: its own token is always there
        torch.testing.assert_close(got[r : r + 1], expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "remap,window",
    [(SelfExtend(group_size=3, window=5), None), (ReRoPE(window=4), None), (ReRoPE(window=4), 9)],
)
@pytest.mark.parametrize("queries", [1, 4])
def test_remapped_rows_equal_remap_attention_on_their_own_sequence(remap, window, queries):
    rotary = RotaryEmbedding(HEAD_DIM, base=10000.0, layout="half", max_position_embeddings=4096)
    q, keys = _case(7, 3, queries, queries + 3, 40, 40)
    keys = dataclasses.replace(keys, memo={})  # the prefix's rotated keys kept: the second call reads them
    first = keys.length + keys.own_k.shape[-2] - queries
    got = _attend(q, keys, first, rotary, remap, 1 / math.sqrt(HEAD_DIM), window)
    assert len(keys.memo) == 2
    torch.testing.assert_close(_attend(q, keys, first, rotary, remap, 1 / math.sqrt(HEAD_DIM), window), got)
    for r in range(3):
        k, v = _row_keys(keys, r)
        expected = remap_attention(q[r : r + 1], k, v, rotary, remap, kernel="blocks", window=window)
        torch.testing.assert_close(got[r : r + 1], expected, atol=2e-5, rtol=1e-5)


def test_outside_its_context_the_implementation_refuses():
    q, keys = _case(0, 1, 1, 1, 4, 4)
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
