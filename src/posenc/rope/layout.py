"""Moving a RoPE checkpoint between pair layouts.

:func:`convert_layout` permutes the rows of q/k projection weights (and biases) so that a checkpoint
trained with one pairing ("interleaved": pairs (2i, 2i+1), Meta's Llama, GPT-J; "half": pairs
(i, i + r/2), GPT-NeoX, Hugging Face Llama) gives the same attention scores under the other. This is
the permutation Hugging Face's Llama conversion script applies to Meta's checkpoints.
"""

from __future__ import annotations

import torch

from .. import _checks

__all__ = ["convert_layout", "layout_permutation"]


def layout_permutation(head_dim: int, from_: str, to: str, rotary_dim: int | None = None) -> torch.Tensor:
    """Index p (head_dim,) such that dimension j of a head in layout ``to`` is dimension p[j] in ``from_``.

    Only the first rotary_dim dimensions move; the rest (partial rotary) stay in place.
    """
    head_dim = _checks.even_int("head_dim", head_dim)
    r = head_dim if rotary_dim is None else _checks.even_int("rotary_dim", rotary_dim)
    if r > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    _checks.one_of("from_", from_, _checks.LAYOUTS)
    _checks.one_of("to", to, _checks.LAYOUTS)
    # half position i < r/2 holds the first member of pair i (interleaved 2i), r/2 + i the second (2i + 1)
    to_half = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2)))
    if from_ == to:
        rot = torch.arange(r)
    elif to == "half":
        rot = to_half
    else:
        rot = torch.argsort(to_half)
    return torch.cat((rot, torch.arange(r, head_dim)))


def convert_layout(
    weight: torch.Tensor,
    head_dim: int,
    from_: str = "interleaved",
    to: str = "half",
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Permute a q or k projection's output rows from one RoPE layout to the other.

    Args:
        weight: an ``nn.Linear`` weight (n_heads * head_dim, in_features) or bias (n_heads * head_dim,),
            heads stacked along the first axis as every Hugging Face q_proj / k_proj has them.
        head_dim: size of each head.
        from_, to: "interleaved" or "half".
        rotary_dim: rotated dimensions per head (partial rotary); default head_dim.

    Returns:
        a new tensor of the same shape. With the converted q and k weights and ``layout=to``, the attention
        scores equal those of the original weights with ``layout=from_``. Values and outputs are unchanged.
    """
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() not in (1, 2):
        raise ValueError(
            f"weight must be a weight (out, in) or a bias (out,), got shape {tuple(weight.shape)}"
        )
    perm = layout_permutation(head_dim, from_, to, rotary_dim)
    out = weight.shape[0]
    if out % head_dim:
        raise ValueError(f"weight's first dimension ({out}) must be a multiple of head_dim={head_dim}")
    heads = out // head_dim
    w = weight.reshape(heads, head_dim, *weight.shape[1:])
    return w[:, perm.to(weight.device)].reshape(weight.shape).clone()
