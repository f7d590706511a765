"""Random (q, k, v) for the blocked-attention tests: shapes from a case dict with batch, heads, kv_heads,
q_len, k_len, head_dim and v_dim (:func:`draw_shapes` draws one); seeded by the lengths, so each case has its
own fixed inputs."""

import torch


def random_qkv(c: dict, dtype=torch.float32, grad: bool = False) -> list[torch.Tensor]:
    """[q (batch, heads, q_len, head_dim), k (batch, kv_heads, k_len, head_dim), v (..., v_dim)]."""
    gen = torch.Generator().manual_seed(c["q_len"] * 100 + c["k_len"])
    shapes = (
        (c["batch"], c["heads"], c["q_len"], c["head_dim"]),
        (c["batch"], c["kv_heads"], c["k_len"], c["head_dim"]),
        (c["batch"], c["kv_heads"], c["k_len"], c["v_dim"]),
    )
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_(grad) for s in shapes]


def draw_shapes(draw, max_len: int = 24, head_dims=(4, 8), v_dims=(4, 6)) -> dict:
    """A hypothesis draw of the shape fields: batch 1-2, kv_heads 1-2 times a group of 1-3 query heads each
    (grouped-query attention), 1 <= q_len <= k_len <= max_len, head_dim and v_dim from the choices."""
    from hypothesis import strategies as st

    kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    k_len = draw(st.integers(1, max_len))
    return dict(
        batch=draw(st.integers(1, 2)),
        heads=kv_heads * group,
        kv_heads=kv_heads,
        q_len=draw(st.integers(1, k_len)),
        k_len=k_len,
        head_dim=draw(st.sampled_from(list(head_dims))),
        v_dim=draw(st.sampled_from(list(v_dims))),
    )
