"""Random (q, k, v) for the blocked-attention tests: shapes from a case dict with batch, heads, kv_heads,
q_len, k_len, head_dim and v_dim; seeded by the lengths, so each case has its own fixed inputs."""

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
