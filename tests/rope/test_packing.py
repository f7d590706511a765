"""posenc.packed_positions against posenc.reference.packed_positions; RoPE at packed positions rotates each
document as if it were alone; a patched transformers model takes packed position ids as the model does;
bad boundaries are refused by name."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
import posenc.hf
from posenc import reference as R

from ..hf.test_remap_models import tiny_llama

LENGTHS = st.lists(st.integers(0, 9), min_size=1, max_size=6)


@given(LENGTHS)
def test_positions_from_either_boundary_are_the_references(lengths):
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    want = R.packed_positions(lengths)
    np.testing.assert_array_equal(posenc.packed_positions(cu_seqlens=cu).numpy(), want)
    ids = torch.tensor(np.repeat(np.cumsum(np.array(lengths) > 0) % 2, lengths))  # ids repeat, runs do not
    np.testing.assert_array_equal(posenc.packed_positions(document_ids=ids).numpy(), want)
    both = posenc.packed_positions(document_ids=torch.stack([ids, ids.flip(0)]))
    np.testing.assert_array_equal(both[0].numpy(), want)
    np.testing.assert_array_equal(both[1].numpy(), R.packed_positions(lengths[::-1]))


@given(LENGTHS.filter(lambda n: sum(n) > 0), st.sampled_from(["half", "interleaved"]))
def test_rope_at_packed_positions_rotates_each_document_alone(lengths, layout):
    rope = posenc.RotaryEmbedding(8, layout=layout)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]))
    q, k = torch.randn(1, 2, int(cu[-1]), 8), torch.randn(1, 1, int(cu[-1]), 8)
    got_q, got_k = rope(q, k, positions=posenc.packed_positions(cu_seqlens=cu))
    alone = [rope(q[:, :, a:b], k[:, :, a:b]) for a, b in zip(cu[:-1], cu[1:], strict=True) if b > a]
    torch.testing.assert_close(
        got_q, torch.cat([a[0] for a in alone], 2), rtol=1e-6, atol=1e-6
    )  # one rounding apart: two kernels
    torch.testing.assert_close(
        got_k, torch.cat([a[1] for a in alone], 2), rtol=1e-6, atol=1e-6
    )  # one rounding apart: two kernels


@torch.no_grad()
def test_a_patched_model_takes_packed_position_ids_as_the_model_does():
    """Without a cache (training), transformers reads restarting position ids as packed documents (a
    block-diagonal mask); patched, the logits are the model's own, and each document's those it has alone."""
    model = tiny_llama()
    ids = torch.randint(1, 128, (1, 17))
    positions = posenc.packed_positions(cu_seqlens=torch.tensor([0, 6, 17]))[None]
    want = model(ids, position_ids=positions, use_cache=False).logits
    posenc.hf.patch_model(model)
    got = model(ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, 6:], model(ids[:, 6:], use_cache=False).logits, rtol=1e-5, atol=1e-5)
    posenc.hf.unpatch_model(model)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of cu_seqlens and document_ids"),
        ({"cu_seqlens": torch.tensor([1, 4])}, "cu_seqlens must start at 0"),
        ({"cu_seqlens": torch.tensor([0, 4, 2])}, "cu_seqlens must not decrease"),
        ({"cu_seqlens": torch.tensor([0.0, 4.0])}, "cu_seqlens must be a 1-D integer tensor"),
        ({"cu_seqlens": [0, 4]}, "cu_seqlens must be a 1-D integer tensor"),
        ({"document_ids": torch.zeros(1, 2, 3, dtype=torch.long)}, "document_ids must be an integer tensor"),
        ({"document_ids": torch.zeros(3)}, "document_ids must be an integer tensor"),
    ],
)
def test_bad_boundaries_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        posenc.packed_positions(**kwargs)


def test_m_rope_positions_of_packed_documents_each_start_at_zero():
    from posenc.rope import mrope_positions

    text = torch.zeros(1, 9, dtype=torch.long)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2]])
    got, _ = mrope_positions(text, document_ids=ids)
    want = posenc.packed_positions(document_ids=ids[0]).expand(3, -1)
    torch.testing.assert_close(got[:, 0], want)
    # two documents, each text, a 2x2 image and text: as if each were alone
    doc = torch.tensor([0, 1, 1, 1, 1, 0, 0])
    grids = torch.tensor([[1, 2, 2], [1, 2, 2]])
    packed, delta = mrope_positions(
        torch.cat([doc, doc])[None], grids, document_ids=torch.tensor([[5] * 7 + [3] * 7])
    )
    alone, alone_delta = mrope_positions(doc[None], grids[:1])
    torch.testing.assert_close(packed[:, 0], torch.cat([alone[:, 0], alone[:, 0]], 1))
    assert torch.equal(delta, alone_delta)  # decoding continues the last document
    with pytest.raises(ValueError, match="grid \\(1, 2, 2\\) needs 4 image tokens"):
        mrope_positions(doc[None], grids[:1], document_ids=torch.tensor([[0, 0, 0, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="document_ids must be an integer tensor of token_types' shape"):
        mrope_positions(doc[None], grids[:1], document_ids=torch.zeros(7))
