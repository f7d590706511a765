"""posenc.real.scoring.window_stats: the sums every report measure is made of."""

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.real.scoring import window_stats


@given(n=st.integers(1, 700), tail=st.integers(1, 800), head=st.integers(1, 800))
def test_window_stats_are_the_sums_of_their_parts_of_the_losses(n, tail, head):
    nll = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64) * 5
    values = nll.tolist()
    stats = window_stats(nll, tail, head)
    assert stats["all"] == [math.fsum(values), n]
    assert stats["tail"] == [math.fsum(values[n - min(tail, n) :]), min(tail, n)]
    assert stats["head"] == [math.fsum(values[: min(head, n)]), min(head, n)]
    buckets = stats["buckets"]
    assert buckets[0][0] == 0 and buckets[-1][1] == n
    for (a, b, total, count), nxt in zip(buckets, buckets[1:] + [None], strict=True):
        assert count == b - a > 0 and total == math.fsum(values[a:b])
        assert b in (n, 64) or b == 2 * a  # [0, 64), [64, 128), [128, 256), ... then the window's end
        if nxt is not None:
            assert nxt[0] == b
