"""shard_indices against torch's load balancers and Megatron/TransformerEngine's THD formula; every layout a
partition of the sequence; shard/unshard inverse; refusals."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.parallel import LAYOUTS, shard, shard_indices, shard_positions, unit, unshard


@given(st.integers(1, 200), st.integers(1, 8), st.sampled_from(LAYOUTS))
def test_every_layout_partitions_the_sequence_into_equal_shards(length, world, layout):
    shards = [shard_indices(length, world, r, layout, pad=True) for r in range(world)]
    assert len({s.numel() for s in shards}) == 1
    everything = torch.cat(shards)
    real = everything[everything >= 0]
    assert sorted(real.tolist()) == list(range(length))
    assert everything.numel() - real.numel() == (-length) % unit(layout, world)


@given(st.integers(1, 40), st.integers(1, 6))
def test_headtail_equals_torch_load_balancer(chunk, world):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    length = 2 * world * chunk
    theirs = _HeadTailLoadBalancer(length, world, "cpu")._generate_indices()[0].view(world, -1)
    for r in range(world):
        assert torch.equal(shard_indices(length, world, r, "headtail"), theirs[r].long())


def test_contiguous_and_striped_are_what_they_say():
    assert shard_indices(12, 3, 1, "contiguous").tolist() == [4, 5, 6, 7]
    assert shard_indices(12, 3, 1, "striped").tolist() == [1, 4, 7, 10]
    assert shard_indices(8, 2, 0, "headtail").tolist() == [0, 1, 6, 7]


def _thd_partitioned_indices(cu_seqlens, cp_size, cp_rank):
    """TransformerEngine's thd_get_partitioned_indices as its documentation states it: each sequence in 2 x
    cp_size chunks, rank r taking chunk r and chunk 2 cp_size - 1 - r of every sequence."""
    out = []
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        chunk = (end - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            out.extend(range(start + c * chunk, start + (c + 1) * chunk))
    return out


@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.integers(1, 4), st.data())
def test_packed_documents_equal_the_thd_formula(chunks, world, data):
    lengths = [2 * world * c for c in chunks]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    rank = data.draw(st.integers(0, world - 1))
    mine = shard_indices(cu[-1], world, rank, cu_seqlens=torch.tensor(cu))
    assert mine.tolist() == _thd_partitioned_indices(cu, world, rank)


def test_packed_documents_keep_their_global_indices_megatron_5243():
    # cu_seqlens [0, 4, 8] on 2 ranks: rank 0 holds tokens 0, 3 of the first document and 4, 7 of the second
    cu = torch.tensor([0, 4, 8])
    indices = shard_indices(8, 2, 0, cu_seqlens=cu)
    assert indices.tolist() == [0, 3, 4, 7]
    assert shard_positions(indices, cu_seqlens=cu).tolist() == [0, 3, 0, 3]  # positions inside each document


def test_packed_documents_equal_torch_per_document_balancer_per_document():
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _PerDocumentHeadTailLoadBalancer,
    )

    lengths, world = [4, 8, 4], 2
    cu = torch.tensor([0, 4, 12, 16])
    order = _PerDocumentHeadTailLoadBalancer([lengths], world, "cpu")._generate_indices()[0].tolist()
    # torch lists each document's rank pieces in rank order; rank r's are the r-th piece of every document
    pieces, start = {r: [] for r in range(world)}, 0
    for n in lengths:
        doc = order[start : start + n]
        for r in range(world):
            pieces[r] += doc[r * n // world : (r + 1) * n // world]
        start += n
    for r in range(world):
        assert shard_indices(16, world, r, cu_seqlens=cu).tolist() == pieces[r]
    assert shard_indices(16, world, 0, cu_seqlens=cu).tolist() == [0, 3, 4, 5, 10, 11, 12, 15]


def test_padded_documents_mark_their_pad_slots():
    indices = shard_indices(7, 2, 1, cu_seqlens=torch.tensor([0, 3, 7]), pad=True)
    assert indices.tolist() == [1, 2, 4, 5]
    indices = shard_indices(7, 2, 0, cu_seqlens=torch.tensor([0, 3, 7]), pad=True)
    assert indices.tolist() == [0, -1, 3, 6]


@given(st.integers(1, 60), st.integers(1, 5), st.sampled_from(LAYOUTS))
def test_unshard_inverts_shard(length, world, layout):
    x = torch.randn(2, 3, length)
    indices = [shard_indices(length, world, r, layout, pad=True) for r in range(world)]
    shards = [shard(x, i) for i in indices]
    assert torch.equal(unshard(shards, indices, length), x)


def test_mrope_positions_are_sharded_on_the_sequence_axis():
    positions = torch.arange(3 * 2 * 8).view(3, 2, 8)
    indices = shard_indices(8, 2, 1, "headtail")
    got = shard_positions(indices, positions=positions)
    assert got.shape == (3, 2, 4)
    assert torch.equal(got, positions[..., [2, 3, 4, 5]])


def test_positions_default_to_the_indices():
    indices = shard_indices(10, 2, 0, "headtail", pad=True)
    assert indices.tolist() == [0, 1, 2, 9, -1, -1]
    assert shard_positions(indices).tolist() == [0, 1, 2, 9, 0, 0]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: shard_indices(10, 4, 0, "headtail"), "length must be a multiple of 8.*got 10.*pad=True"),
        (lambda: shard_indices(10, 4, 0, "striped"), "length must be a multiple of 4"),
        (lambda: shard_indices(8, 2, 2), r"rank must be in \[0, world_size = 2\), got 2"),
        (lambda: shard_indices(8, 2, 0, "zigzag"), "layout must be one of"),
        (lambda: shard_indices(8, 0, 0), "world_size must be an integer >= 1"),
        (
            lambda: shard_indices(8, 2, 0, "striped", cu_seqlens=torch.tensor([0, 8])),
            "layout must be 'headtail'",
        ),
        (
            lambda: shard_indices(8, 2, 0, cu_seqlens=torch.tensor([0, 4])),
            "cu_seqlens must end at length = 8",
        ),
        (lambda: shard_indices(8, 2, 0, cu_seqlens=torch.tensor([0, 6, 8])), "document 0's length must be"),
        (
            lambda: shard_indices(8, 2, 0, cu_seqlens=torch.tensor([0.0, 8.0])),
            "cu_seqlens must be a 1-D integer",
        ),
        (lambda: shard(torch.zeros(4), torch.tensor([0, 9])), "indices reach 9"),
        (lambda: unshard([torch.zeros(2)], [torch.tensor([0, 0])], 2), "do not cover 0 .. 1 exactly once"),
    ],
)
def test_bad_input_is_refused_with_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_packed_positions_agree_with_posenc():
    cu = torch.tensor([0, 4, 12, 16])
    indices = shard_indices(16, 2, 1, cu_seqlens=cu)
    assert torch.equal(
        shard_positions(indices, cu_seqlens=cu), posenc.packed_positions(cu_seqlens=cu)[indices]
    )
