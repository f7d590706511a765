"""Ring attention with every rank in one process (the same ring, the transfers replaced by handing a list
on): outputs and gradients against posenc.attention on the gathered sequence, for every position term,
layout, world size, causal and not, pads and packed documents; and the refusals."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.parallel import LAYOUTS, ring_attention, shard, unshard, virtual_ring_attention

from .cases import TERMS, TOLERANCE, gradients, make_case, parameter_error, weight_for


def _virtual(case, world, layout):
    indices = [case.indices(world, r, layout) for r in range(world)]
    per_rank = [case.shard_kwargs(i) for i in indices]
    kwargs = dict(per_rank[0])
    per_rank_bias = case.gates is not None or case.rel is not None
    for key in ("positions", "document_ids", *(("bias",) if per_rank_bias else ())):
        if key in kwargs:
            kwargs[key] = [kw[key] for kw in per_rank]
    outs = virtual_ring_attention(
        [shard(case.q, i, 2) for i in indices],
        [shard(case.k, i, 2) for i in indices],
        [shard(case.v, i, 2) for i in indices],
        indices=indices,
        **kwargs,
    )
    return unshard(outs, indices, case.length, dim=2)


def _error(case, world, layout):
    out = _virtual(case, world, layout)
    ref = case.reference()
    weight = weight_for(case)
    mine, theirs = gradients(case, out, weight), gradients(case, ref, weight)
    pairs = [(out, ref), *zip(mine[:3], theirs[:3], strict=True)]
    err = max((a - b).abs().max().item() for a, b in pairs)
    return max([err, *(parameter_error(a, b) for a, b in zip(mine[3:], theirs[3:], strict=True))])


@given(
    st.sampled_from(TERMS),
    st.integers(1, 4),
    st.sampled_from(LAYOUTS),
    st.booleans(),
    st.integers(2, 40),
    st.sampled_from([6, 8]),
)
def test_virtual_ring_equals_one_process_float64(term, world, layout, causal, length, v_dim):
    # v_dim 8 (as wide as the queries) runs the flash kernel's blocks, 6 the ring's own arithmetic
    if term.endswith("documents"):
        length = max(length, 4)
    case = make_case(term, length, causal, torch.float64, v_dim=v_dim)
    assert _error(case, world, layout) <= TOLERANCE[torch.float64]


@pytest.mark.parametrize("v_dim", [6, 8])
@pytest.mark.parametrize("term", TERMS)
def test_virtual_ring_equals_one_process_float32(term, v_dim):
    case = make_case(term, 23, True, torch.float32, v_dim=v_dim)
    assert _error(case, 3, "headtail") <= TOLERANCE[torch.float32]


def test_untrained_terms_run_on_the_flash_kernel_and_trained_biases_do_not(monkeypatch):
    from posenc.parallel import blocks

    calls = []
    real = blocks.flash
    monkeypatch.setattr(blocks, "flash", lambda *a, **k: calls.append(1) or real(*a, **k))
    _error(make_case("alibi", 20, True, v_dim=8), 2, "headtail")
    assert calls
    calls.clear()
    _error(make_case("t5", 20, True, v_dim=8), 2, "headtail")  # its table's gradient needs the scores
    _error(make_case("alibi", 20, True, v_dim=6), 2, "headtail")  # the kernel wants v as wide as q
    assert not calls


def test_a_chunk_of_rows_takes_only_the_keys_it_may_see(monkeypatch):
    # small chunks of rows and a narrow window: the gathered-columns path runs, and stays exact
    from posenc.parallel import blocks

    monkeypatch.setattr(blocks, "_CHUNK_SCORES", 64)
    case = make_case("window-alibi", 37, True, torch.float64)
    assert _error(case, 2, "contiguous") <= TOLERANCE[torch.float64]


def test_dynamic_rope_takes_the_whole_sequence_length_on_every_rank():
    # each rank's own last position would give it its own NTK base (the trap of keeping per-shard lengths)
    case = make_case("dynamic", 30, True, torch.float64)
    assert _error(case, 3, "headtail") <= TOLERANCE[torch.float64]


def _shards(n=8, world=2):
    q, k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
    indices = [torch.arange(r * n // world, (r + 1) * n // world) for r in range(world)]
    return (
        [shard(q, i, 2) for i in indices],
        [shard(k, i, 2) for i in indices],
        [shard(v, i, 2) for i in indices],
        indices,
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"remap": posenc.ReRoPE(4)}, "remap=ReRoPE.* needs rotary=posenc.RotaryEmbedding"),
        ({"remap": posenc.ReRoPE(4), "rotary": posenc.XPos(4)}, "needs rotary=posenc.RotaryEmbedding"),
        (
            {"remap": posenc.ReRoPE(4), "rotary": posenc.RotaryEmbedding(4), "causal": False},
            "is causal, without a bias",
        ),
        ({"remap": "rerope", "rotary": posenc.RotaryEmbedding(4)}, "remap must be a posenc.remap.Remap"),
        (
            {"bias": torch.zeros(2, 8, 8)},
            "bias tensors are not supported across ranks",
        ),
        ({"bias": posenc.CoPE(4, 8), "causal": False}, "a CoPE works with causal attention only"),
        ({"bias": posenc.ShawRelative(4), "window": 3}, "a ShawRelative takes no window across ranks"),
        ({"bias": posenc.ShawRelative(8)}, "q has last dimension 4, but ShawRelative was built for 8"),
        (
            {"bias": posenc.ShawRelative(4, v_dim=6)},
            "v has last dimension 4, but ShawRelative was built for 6",
        ),
        ({"window": 0}, "window must be an integer >= 1"),
        ({"rotary": "rope"}, "rotary must be a posenc rotary embedding"),
        ({"sinks": torch.zeros(3)}, r"sinks must be a tensor of shape \(heads,\) = \(2,\)"),
    ],
)
def test_bad_terms_are_refused_before_any_work(kwargs, match):
    qs, ks, vs, indices = _shards()
    with pytest.raises(ValueError, match=match):
        virtual_ring_attention(qs, ks, vs, indices=indices, **kwargs)


def test_shards_that_disagree_are_refused():
    qs, ks, vs, indices = _shards()
    with pytest.raises(ValueError, match=r"indices\[1\] has 3 entries, but the shard holds 4 tokens"):
        virtual_ring_attention(qs, ks, vs, indices=[indices[0], indices[1][:3]])
    with pytest.raises(ValueError, match="qs must hold one entry per rank"):
        virtual_ring_attention(qs[:1], ks, vs, indices=indices)


def test_ring_attention_needs_a_process_group():
    qs, ks, vs, indices = _shards(world=1)
    with pytest.raises(ValueError, match="needs torch.distributed initialised"):
        ring_attention(qs[0], ks[0], vs[0], indices=indices[0])


def test_head_tail_blocks_are_whole_causal_or_skipped_run_pairs_and_striped_ones_are_masked():
    from posenc.parallel import blocks, shard_indices

    def pairs(layout, q_rank, k_rank, length=16):
        rule = blocks.Rule(causal=True, window=None, bias=None, scale=1.0)
        q_index, k_index = (shard_indices(length, 2, r, layout) for r in (q_rank, k_rank))
        n = length // 2
        queries = blocks.Queries(torch.zeros(1, 1, n, 4), q_index, q_index, None)
        keys = blocks.Keys(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4), k_index, k_index, None)
        return blocks._run_pairs(rule, queries, keys)

    # rank 0 holds 0-3 and 12-15, rank 1 holds 4-11: its tail sees all of rank 1, its head none
    assert [(r.start, c.start, causal) for r, c, causal in pairs("headtail", 0, 1)] == [(4, 0, False)]
    assert [causal for _, _, causal in pairs("headtail", 0, 0)] == [True, False, True]
    assert pairs("striped", 0, 1, length=64) is None  # 32 runs of one token: the masked chunks
