"""Multimodal position layouts from transformers' own Qwen-VL code, without building a vision tower."""

from __future__ import annotations

import types

import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

MODELS = {"qwen2_vl": Qwen2VLModel, "qwen2_5_vl": Qwen2_5_VLModel, "qwen3_vl": Qwen3VLModel}
MERGE = 2


def hf_rope_index(family: str, types_, *, mask=None, images=None, videos=None, seconds=None, tps=2):
    """transformers' get_rope_index for these token types and grids: (positions (3, B, S), deltas (B, 1))."""
    cls = MODELS[family]
    vision = types.SimpleNamespace(spatial_merge_size=MERGE, tokens_per_second=tps)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = lambda *a, **k: cls.get_vision_position_ids(fake, *a, **k)
    kwargs = {"second_per_grid_ts": seconds} if family == "qwen2_5_vl" else {}
    ids = torch.zeros_like(types_)
    return cls.get_rope_index(
        fake, ids, types_, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, **kwargs
    )


def layout(family: str = "qwen2_vl", pad: int = 2):
    """A batch of two: text, an image (grid 1x4x6 -> 6 tokens), text, a video (2x8x8 -> 32 tokens), text;
    the second sequence left-padded by ``pad``. Returns token types (2, S), attention mask, image and
    video grids (one per sequence each, in order). Qwen3-VL puts a timestamp (text) between frames."""
    video = [2] * 16 + [0] * 2 + [2] * 16 if family == "qwen3_vl" else [2] * 32
    one = [0] * 3 + [1] * 6 + [0] * 4 + video + [0] * 3
    seq = len(one)
    types_ = torch.tensor([one, [0] * pad + one[: seq - pad]])
    # the padded sequence loses its last `pad` text tokens
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, :pad] = 0
    images = torch.tensor([[1, 4, 6], [1, 4, 6]])
    videos = torch.tensor([[2, 8, 8], [2, 8, 8]])
    return types_, mask, images, videos
