"""StreamingKVCache (Xiao et al. 2023): the sink tokens and a recent window, rotated at their positions in
the cache; every step equals a fresh forward pass over the kept tokens at those positions."""

import numpy as np
import pytest
import torch

import posenc
from posenc import reference as R


@pytest.mark.parametrize("chunks", [[1] * 30, [7, 1, 1, 5, 3, 1, 6, 1, 1, 4]])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_each_step_is_a_fresh_pass_over_the_kept_tokens_at_their_cache_positions(chunks, layout):
    sinks, window = 3, 8
    rope = posenc.RotaryEmbedding(8, layout=layout)
    cache = posenc.StreamingKVCache(rope, sink_tokens=sinks, window=window)
    gen = torch.Generator().manual_seed(0)
    total = sum(chunks)
    q_all, k_all, v_all = (
        torch.randn(2, 4 if t == "q" else 2, total, 8, generator=gen, dtype=torch.float64) for t in "qkv"
    )
    seen = 0
    for new in chunks:
        sl = slice(seen, seen + new)
        q_rot, k_rot, v_kept = cache.update(q_all[:, :, sl], k_all[:, :, sl], v_all[:, :, sl])
        seen += new
        # kept: the first `sinks` tokens of the stream, then the most recent, sinks + window at most
        n = min(seen, sinks + window)
        head = min(sinks, n)
        kept = list(range(head)) + list(range(seen - (n - head), seen))
        assert cache.length == n and cache.seen == seen
        np.testing.assert_allclose(
            k_rot.numpy(), R.rope(k_all[:, :, kept].numpy(), np.arange(n), layout=layout), atol=1e-12
        )
        np.testing.assert_allclose(
            q_rot.numpy(), R.rope(q_all[:, :, sl].numpy(), np.arange(n - new, n), layout=layout), atol=1e-12
        )
        torch.testing.assert_close(v_kept, v_all[:, :, kept])
        fresh = posenc.attention(q_all[:, :, sl], k_all[:, :, kept], v_all[:, :, kept], rotary=rope)
        torch.testing.assert_close(posenc.attention(q_rot, k_rot, v_kept), fresh, rtol=1e-12, atol=1e-12)


def test_what_the_streaming_cache_refuses():
    cache = posenc.StreamingKVCache(posenc.RotaryEmbedding(8), sink_tokens=2, window=4)
    x = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="at most window=4 new tokens at a time"):
        cache.update(x, x, x)
    cache.update(x[:, :, :2], x[:, :, :2], x[:, :, :2])
    with pytest.raises(ValueError, match="keep the cached \\(batch, kv_heads\\)"):
        cache.update(x[:, :1, :1], x[:, :1, :1], x[:, :1, :1])
    with pytest.raises(ValueError, match="sink_tokens must be"):
        posenc.StreamingKVCache(posenc.RotaryEmbedding(8), sink_tokens=-1)
    with pytest.raises(ValueError, match="rotary must be a posenc.RotaryEmbedding"):
        posenc.StreamingKVCache("rope")
    cache.reset()
    assert cache.length == 0 and cache.seen == 0
