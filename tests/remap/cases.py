"""What every remap's test file checks, against posenc.reference.remapped_attention and the remap's own
distance function there: values in float64 and float32 (prefill and decoding, GQA, both layouts, partial
rotary, a scaled schedule, any block size), gradients, decoding token by token with a cache of unrotated
keys."""

import numpy as np
import torch
from hypothesis import strategies as st

import posenc
from posenc import reference as R

from ..qkv import draw_shapes, random_qkv

ROTARIES = {
    "interleaved": dict(head_dim=8),
    "half": dict(head_dim=8, layout="half"),
    "partial": dict(head_dim=8, rotary_dim=4, layout="half", base=500.0),
    "yarn": dict(
        head_dim=8,
        layout="half",
        scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ),
    "dynamic": dict(head_dim=8, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16),
}


@st.composite
def case(draw):
    return dict(
        draw_shapes(draw, max_len=40, head_dims=(8,), v_dims=(4, 8)),
        offset=draw(st.sampled_from([0, 0, 5])),
        rotary=draw(st.sampled_from(sorted(ROTARIES))),
        block=draw(st.one_of(st.none(), st.integers(1, 9))),
        kernel=draw(st.sampled_from(["flash", "blocks", "flex"])),
    )


def oracle(q, k, v, rotary, distance, remap, offset: int) -> np.ndarray:
    """posenc.reference.remapped_attention with the rotary's frequencies at the sequence's length."""
    context = offset + k.shape[-2]
    inv_freq, attention_factor = rotary.frequencies(context)
    g = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(g, 1).double().numpy() for t in (k, v))
    i = torch.arange(offset + k.shape[-2] - q.shape[-2], offset + k.shape[-2])
    scale = remap.query_scale(i)
    return R.remapped_attention(
        q.double().numpy(),
        k,
        v,
        distance,
        layout=rotary.layout,
        rotary_dim=rotary.rotary_dim,
        inv_freq=inv_freq.numpy(),
        attention_factor=attention_factor,
        query_scale=None if scale is None else scale.numpy(),
    )


def check_against_oracle(c: dict, remap, distance_fn, dtype=torch.float64, tol=1e-10) -> None:
    """posenc.attention(..., remap=) on case ``c`` equals the oracle; ``distance_fn(q_len, k_len, offset)``
    is the remap's distance function of posenc.reference."""
    rotary = posenc.RotaryEmbedding(**ROTARIES[c["rotary"]])
    q, k, v = random_qkv(c, dtype)
    from posenc.remap import remap_attention

    got = remap_attention(q, k, v, rotary, remap, offset=c["offset"], block=c["block"], kernel=c["kernel"])
    want = oracle(q, k, v, rotary, distance_fn(c["q_len"], c["k_len"], c["offset"]), remap, c["offset"])
    np.testing.assert_allclose(got.double().numpy(), want, rtol=tol, atol=tol)


def check_gradients(remap, block: int = 3) -> None:
    """torch.autograd.gradcheck through the blocked kernel (several blocks) and the rotations."""
    c = dict(batch=1, heads=2, kv_heads=1, q_len=10, k_len=12, head_dim=8, v_dim=4)
    rotary = posenc.RotaryEmbedding(8, layout="half")
    q, k, v = random_qkv(c, torch.float64, grad=True)
    torch.autograd.gradcheck(
        lambda q, k, v: posenc.attention(q, k, v, rotary=rotary, remap=remap, offset=3), (q, k, v)
    )
    from posenc.remap import remap_attention

    for kernel in ("flash", "blocks"):
        torch.autograd.gradcheck(
            lambda q, k, v, kernel=kernel: remap_attention(
                q, k, v, rotary, remap, offset=3, block=block, kernel=kernel
            ),
            (q, k, v),
        )


def check_decoding(remap, length: int = 30, prompt: int = 7) -> None:
    """Decoding one token at a time against a cache of unrotated keys gives the full pass's rows."""
    c = dict(batch=1, heads=4, kv_heads=2, q_len=length, k_len=length, head_dim=8, v_dim=8)
    rotary = posenc.RotaryEmbedding(8, layout="half")
    q, k, v = random_qkv(c, torch.float64)
    full = posenc.attention(q, k, v, rotary=rotary, remap=remap)
    rows = [
        posenc.attention(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], rotary=rotary, remap=remap)
    ]
    for t in range(prompt, length):
        rows.append(
            posenc.attention(
                q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], rotary=rotary, remap=remap
            )
        )
    torch.testing.assert_close(torch.cat(rows, 2), full, rtol=1e-12, atol=1e-12)
