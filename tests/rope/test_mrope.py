"""MRotaryEmbedding and the M-RoPE position builder against posenc.reference.mrope and transformers'
Qwen2-VL / Qwen2.5-VL / Qwen3-VL code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import MRotaryEmbedding, RotaryEmbedding
from posenc import reference as R
from posenc.rope.mrope import mrope_axes, mrope_decode_positions, mrope_positions

from ..hf.vl import MERGE, hf_rope_index, layout


def random_positions(batch, seq, seed=0, high=50):
    return torch.randint(0, high, (3, batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "section, interleaved",
    [
        ((4, 2, 2), False),
        ((4, 2, 2), True),
        ((8, 12, 12), False),
        ((24, 20, 20), False),
        ((24, 20, 20), True),
    ],
)
def test_rotation_matches_the_reference(section, interleaved):
    head_dim = 2 * sum(section)
    rot = MRotaryEmbedding(head_dim, section, base=1e4, interleaved=interleaved)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 7, head_dim, generator=g), torch.randn(2, 1, 7, head_dim, generator=g)
    pos = random_positions(2, 7)
    qr, kr = rot(q, k.expand(2, 3, 7, head_dim).contiguous(), pos)
    want = R.mrope(q.numpy(), pos.numpy(), section, 1e4, interleaved)
    np.testing.assert_allclose(qr.numpy(), want, atol=2e-5)
    np.testing.assert_allclose(
        rot.rotate(k, pos).numpy(), R.mrope(k.numpy(), pos.numpy(), section, 1e4, interleaved), atol=2e-5
    )


def test_axes_follow_qwen_layouts():
    assert mrope_axes((2, 3, 3)).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    # Qwen3-VL's [24, 20, 20]: t h w t h w ... for 60 slots, then the last 4 slots are time
    axes = mrope_axes((24, 20, 20), interleaved=True).tolist()
    assert axes[:6] == [0, 1, 2, 0, 1, 2] and axes[60:] == [0, 0, 0, 0]
    assert [axes.count(a) for a in range(3)] == [24, 20, 20]
    for section, inter in (((24, 20, 20), True), ((16, 24, 24), False)):
        assert [R.mrope_axis(k, section, inter) for k in range(64)] == mrope_axes(section, inter).tolist()


@pytest.mark.parametrize(
    "module, section, interleaved",
    [
        ("transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLRotaryEmbedding", [4, 2, 2], False),
        ("transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding", [4, 2, 2], True),
    ],
)
def test_cos_sin_match_transformers(module, section, interleaved):
    import importlib

    import transformers

    path, name = module.rsplit(".", 1)
    cls = getattr(importlib.import_module(path), name)
    cfg_cls = transformers.Qwen2VLTextConfig if "qwen2" in path else transformers.Qwen3VLTextConfig
    config = cfg_cls(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": section},
    )
    pos = random_positions(2, 9, high=5000)
    cos, sin = cls(config)(torch.zeros(1, dtype=torch.float32), pos)
    mine = MRotaryEmbedding(16, section, 1e4, interleaved=interleaved)
    c, s = mine.cos_sin(pos)
    np.testing.assert_allclose(
        torch.cat((c, c), -1).numpy(), cos.numpy(), atol=2e-4
    )  # HF forms angles in float32
    np.testing.assert_allclose(torch.cat((s, s), -1).numpy(), sin.numpy(), atol=2e-4)
    other = MRotaryEmbedding(16, section, 1e4, interleaved=not interleaved).cos_sin(pos)[0]
    assert float((torch.cat((other, other), -1) - cos).abs().max()) > 0.1


def test_ernie_spatial_interleaved_layout_matches_transformers():
    """ERNIE-4.5-VL: its config lists the sections as (height, width, time); the height and width pairs
    alternate, time takes the last ones; dimensions pair (2i, 2i+1)."""
    import transformers
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as ernie

    config = transformers.Ernie4_5_VLMoeTextConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [6, 6, 4]},
    )
    pos = random_positions(2, 9, high=5000)
    cos, sin = ernie.Ernie4_5_VLMoeTextRotaryEmbedding(config)(torch.zeros(1), pos)
    mine = MRotaryEmbedding(32, (4, 6, 6), 1e4, order="spatial-interleaved", layout="interleaved")
    c, s = mine.cos_sin(pos)
    np.testing.assert_allclose(c.repeat_interleave(2, -1).numpy(), cos.numpy(), atol=2e-4)
    np.testing.assert_allclose(s.repeat_interleave(2, -1).numpy(), sin.numpy(), atol=2e-4)
    assert mine.axes.tolist()[:4] == [1, 2, 1, 2] and mine.axes.tolist()[-4:] == [0] * 4
    q = torch.randn(2, 1, 9, 32, dtype=torch.float64)
    want = R.mrope(q.numpy(), pos.numpy(), (4, 6, 6), 1e4, layout="interleaved", order="spatial-interleaved")
    np.testing.assert_allclose(mine.rotate(q, pos).numpy(), want, atol=1e-9)


def test_two_axis_interleaved_layout_matches_neomme():
    """NeoMME: two axes (row, column) alternating pair by pair, per layer type."""
    import transformers
    from transformers.models.neomme import modeling_neomme as neomme

    config = transformers.AutoConfig.for_model(
        "neomme",
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 1.0},
        },
    )
    module = neomme.NeoMMERotaryEmbedding(config.get_text_config())
    pos = random_positions(2, 9, high=5000)[:2]
    for layer_type, base in (("full_attention", 1e4), ("sliding_attention", 1e6)):
        cos, _ = module(torch.zeros(1), pos, layer_type)
        c, _ = MRotaryEmbedding(32, (8, 8), base, order="interleaved").cos_sin(pos)
        np.testing.assert_allclose(torch.cat((c, c), -1).numpy(), cos.numpy(), atol=2e-4)
    assert MRotaryEmbedding(32, (8, 8), order="interleaved").axes.tolist()[:4] == [0, 1, 0, 1]


@settings(max_examples=40, deadline=None)
@given(
    axes=st.integers(2, 4),
    per_axis=st.integers(1, 4),
    order=st.sampled_from(["contiguous", "interleaved", "spatial-interleaved"]),
)
def test_layouts_equal_the_reference(axes, per_axis, order):
    section = (per_axis,) * axes
    got = mrope_axes(section, order=order).tolist()
    assert got == [R.mrope_axis(k, section, order=order) for k in range(sum(section))]
    assert [got.count(a) for a in range(axes)] == list(section)


@settings(max_examples=25, deadline=None)
@given(seq=st.integers(1, 12), start=st.integers(0, 10_000), inter=st.booleans())
def test_text_is_one_dimensional_rope(seq, start, inter):
    # all three axes equal: M-RoPE is plain RoPE, whichever the slot order
    q = torch.randn(1, 2, seq, 16, generator=torch.Generator().manual_seed(seq))
    pos = torch.arange(start, start + seq)[None]
    rot = MRotaryEmbedding(16, (4, 2, 2), 1e4, interleaved=inter)
    plain = RotaryEmbedding(16, 1e4, layout="half")
    want = plain.rotate(q, pos)
    torch.testing.assert_close(rot.rotate(q, pos.expand(3, 1, seq)), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(rot.rotate(q, pos), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_positions_match_transformers_with_left_padding(family):
    types_, mask, images, videos = layout(family, pad=3)
    seconds = torch.tensor([1.5, 0.5]) if family == "qwen2_5_vl" else None
    want, want_deltas = hf_rope_index(
        family, types_, mask=mask, images=images, videos=videos, seconds=seconds
    )
    got, deltas = mrope_positions(
        types_,
        images,
        videos,
        attention_mask=mask,
        spatial_merge_size=MERGE,
        video_seconds=None if seconds is None else seconds.tolist(),
        tokens_per_second=2 if seconds is not None else None,
        split_video_frames=family == "qwen3_vl",
    )
    assert torch.equal(got, want) and torch.equal(deltas, want_deltas)
    # decoding: transformers continues at (real tokens so far) + delta
    seen = mask.sum(-1)
    assert torch.equal(
        mrope_decode_positions(deltas, seen, 2)[:, :, 0], (seen + want_deltas[:, 0]).expand(3, -1)
    )


def test_text_after_a_long_video_continues_after_it():
    # Qwen2.5-VL, a video whose frames sit 4 positions apart (2 tokens/s, 2 s per grid step) on a 2x2 grid:
    # the frames' times reach s + 4 while the grid is 2 wide. Qwen's rule (the original get_rope_index)
    # starts the following text at 1 + the largest position, s + 5. transformers 5.24 starts it at s + 2,
    # inside the video's time span, and then decodes from 1 + the largest position: its prefill and its
    # decoding disagree about where the text is. posenc keeps the original rule.
    types_ = torch.tensor([[0, 0] + [2] * 8 + [0, 0]])
    videos = torch.tensor([[2, 4, 4]])
    want, want_deltas = hf_rope_index("qwen2_5_vl", types_, videos=videos, seconds=torch.tensor([2.0]))
    got, deltas = mrope_positions(
        types_, None, videos, spatial_merge_size=2, video_seconds=[2.0], tokens_per_second=2
    )
    assert got[0, 0, 2:10].tolist() == [2, 2, 2, 2, 6, 6, 6, 6]
    assert got[:, 0, 10:].tolist() == [[7, 8]] * 3  # 1 + the largest position so far
    assert want[:, 0, 10:].tolist() == [[4, 5]] * 3  # transformers 5.24: inside the video's time span
    assert int(deltas) == 9 - 12 and int(want_deltas) == 7 - 12  # both decode from 1 + their maximum


def test_dynamic_ntk_takes_its_length_from_the_largest_position_on_any_axis():
    # text positions: every axis alike, so M-RoPE is 1-D RoPE with dynamic NTK at 1 + the largest position
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    mrope = MRotaryEmbedding(16, (4, 2, 2), scaling=scaling, max_position_embeddings=8)
    rope = RotaryEmbedding(16, scaling=scaling, max_position_embeddings=8, layout="half")
    text = torch.arange(20)
    cos, sin = mrope.cos_sin(text.expand(3, 1, -1))
    want_cos, want_sin = rope.cos_sin(20, positions=text, context_len=20)
    torch.testing.assert_close(cos[0], want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[0], want_sin, rtol=0, atol=1e-6)
    # three axes: the length is 1 + the largest position of any axis (transformers' torch.max(ids) + 1)
    axes = torch.stack([text, text // 2, text + 7])[:, None]  # the width axis reaches 26
    got, _ = mrope.cos_sin(axes)
    plain, _ = mrope.cos_sin(axes, context_len=27)
    torch.testing.assert_close(got, plain, rtol=0, atol=0)
    inside, _ = mrope.cos_sin(axes[..., :1])  # positions 0, 0, 7: within the trained 8, no scaling
    unscaled = MRotaryEmbedding(16, (4, 2, 2), max_position_embeddings=8).cos_sin(axes[..., :1])[0]
    torch.testing.assert_close(inside, unscaled, rtol=0, atol=1e-7)


def test_bad_arguments():
    with pytest.raises(ValueError, match="mrope_section"):
        MRotaryEmbedding(16, (8,), 1e4)  # one axis: not M-RoPE
    with pytest.raises(ValueError, match="spatial axes alternate"):
        MRotaryEmbedding(16, (2, 2, 4), 1e4, order="spatial-interleaved")
    with pytest.raises(ValueError, match="order"):
        MRotaryEmbedding(16, (2, 3, 3), 1e4, order="diagonal")
    with pytest.raises(ValueError, match="mrope_section"):
        MRotaryEmbedding(16, (4, 2, 3), 1e4)  # 9 pairs for 8
    with pytest.raises(ValueError, match="interleaved"):
        MRotaryEmbedding(16, (2, 3, 3), 1e4, interleaved=True)
    rot = MRotaryEmbedding(16, (4, 2, 2))
    q = torch.randn(1, 1, 5, 16)
    with pytest.raises(ValueError, match="3 axes"):
        rot(q, q, torch.zeros(2, 1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="seq length"):
        rot(q, q, torch.zeros(3, 1, 4, dtype=torch.long))
    types_ = torch.tensor([[0, 1, 1, 0]])
    with pytest.raises(ValueError, match="image"):
        mrope_positions(types_)  # an image run and no grid
    with pytest.raises(ValueError, match="needs 4"):
        mrope_positions(types_, image_grids=[[1, 2, 2]])
    with pytest.raises(ValueError, match="left over"):
        mrope_positions(torch.tensor([[0, 0]]), image_grids=[[1, 2, 2]])
    with pytest.raises(ValueError, match="token_types"):
        mrope_positions(torch.tensor([[0, 3]]))


@st.composite
def layouts(draw):
    """Random Qwen2-VL sequences: text runs between image and video grids, time extents within the grid
    (where Qwen's rule and transformers 5.24 agree), some left padding on the second sequence."""
    runs, images, videos = [], [], []
    for _ in range(draw(st.integers(1, 4))):
        runs += [0] * draw(st.integers(1, 3))
        h, w = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        if draw(st.booleans()):
            images.append([1, 2 * h, 2 * w])
            runs += [1] * (h * w)
        else:
            t = draw(st.integers(1, max(h, w)))
            videos.append([t, 2 * h, 2 * w])
            runs += [2] * (t * h * w)
    runs += [0] * draw(st.integers(0, 2))
    pad = draw(st.integers(0, 3))
    types_ = torch.tensor([runs + [0] * pad, [0] * pad + runs])
    mask = torch.ones_like(types_)
    mask[0, len(runs) :] = 0
    mask[1, :pad] = 0
    return types_, mask, images, videos


@settings(max_examples=30, deadline=None)
@given(layout_=layouts())
def test_random_layouts_match_transformers(layout_):
    types_, mask, images, videos = layout_
    images2, videos2 = images + images, videos + videos  # both sequences hold the same grids
    grids = {
        "images": torch.tensor(images2) if images2 else None,
        "videos": torch.tensor(videos2) if videos2 else None,
    }
    want, want_deltas = hf_rope_index("qwen2_vl", types_, mask=mask, **grids)
    got, deltas = mrope_positions(
        types_, grids["images"], grids["videos"], attention_mask=mask, spatial_merge_size=MERGE
    )
    assert torch.equal(got, want) and torch.equal(deltas, want_deltas)


def test_text_positions_of_shape_seq_are_all_three_axes_alike():
    """``positions`` (seq,) is a documented form; it crashed in a permute."""
    m = MRotaryEmbedding(32, [6, 5, 5])
    q, k = torch.randn(1, 2, 12, 32), torch.randn(1, 2, 12, 32)
    pos = torch.arange(12)
    want = m(q, k, pos[None, None].expand(3, 1, 12))
    for got, w in zip(m(q, k, pos), want, strict=True):
        torch.testing.assert_close(got, w)
    for got, w in zip(m(q, k, pos[None]), want, strict=True):
        torch.testing.assert_close(got, w)
