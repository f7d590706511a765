"""posenc.attention(..., remap=): what it refuses, and its memory (no (heads, L, L) tensor at long L)."""

import pytest
import torch

import posenc

from ..peak_memory import peak_rise_mib


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rotary=None), r"SelfExtend\(group_size=2, window=4\) remaps RoPE distances: it needs rotary="),
        (dict(causal=False), "is defined for causal attention only"),
        (dict(bias=posenc.ALiBi(2)), "takes no bias"),
        (dict(positions=torch.arange(6)), "positions= and k_positions= are not supported"),
        (dict(remap="selfextend"), "remap must be a posenc.remap.Remap"),
        (dict(offset=-1), "offset must be"),
        (dict(scale=0.0), "scale must be"),
    ],
)
def test_bad_calls_are_refused_naming_the_argument(kwargs, message):
    q = torch.randn(1, 2, 6, 8)
    call = {"rotary": posenc.RotaryEmbedding(8), "remap": posenc.SelfExtend(2, 4), **kwargs}
    with pytest.raises(ValueError, match=message):
        posenc.attention(q, q, q, **call)


def test_an_empty_query_gives_an_empty_output():
    q, k = torch.randn(1, 2, 0, 8), torch.randn(1, 2, 5, 8)
    out = posenc.attention(q, k, k, rotary=posenc.RotaryEmbedding(8), remap=posenc.ReRoPE(2))
    assert out.shape == (1, 2, 0, 8)


def test_memory_grows_with_the_length_not_its_square():
    """At L = 4096 and 4 heads the (heads, L, L) float32 scores alone are 256 MiB; forward and backward of
    the remapped attention stay far below."""
    rise = peak_rise_mib(
        "rope = posenc.RotaryEmbedding(16); remap = posenc.SelfExtend(4, 256)",
        "posenc.attention(q, k, v, rotary=rope, remap=remap)",
        4096,
    )
    assert rise < 96, f"peak rose by {rise:.0f} MiB"
