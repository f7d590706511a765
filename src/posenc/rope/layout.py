"""Moving RoPE between layouts and between positions without recomputing from scratch.

- :func:`convert_layout` permutes the rows of q/k projection weights (and biases) so that a checkpoint
  trained with one pairing ("interleaved": pairs (2i, 2i+1), Meta's Llama, GPT-J; "half": pairs
  (i, i + r/2), GPT-NeoX, Hugging Face Llama) gives the same attention scores under the other. This is
  the permutation Hugging Face's Llama conversion script applies to Meta's checkpoints.
- :func:`rerotate_keys` shifts keys that are already rotated by ``delta`` positions: R(p + d) = R(d) R(p)
  because the 2x2 rotations of one pair commute, so a cache can move keys (eviction, attention sinks,
  StreamingLLM) without keeping unrotated copies.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..kernels import apply_rotary

__all__ = ["convert_layout", "layout_permutation", "rerotate_keys"]


def layout_permutation(head_dim: int, from_: str, to: str, rotary_dim: int | None = None) -> torch.Tensor:
    """Index p (head_dim,) such that dimension j of a head in layout ``to`` is dimension p[j] in ``from_``.

    Only the first rotary_dim dimensions move; the rest (partial rotary) stay in place.
    """
    _checks.even_int("head_dim", head_dim)
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
        raise ValueError(f"weight must be a weight (out, in) or a bias (out,), got shape {tuple(weight.shape)}")
    perm = layout_permutation(head_dim, from_, to, rotary_dim)
    out = weight.shape[0]
    if out % head_dim:
        raise ValueError(f"weight's first dimension ({out}) must be a multiple of head_dim={head_dim}")
    heads = out // head_dim
    w = weight.reshape(heads, head_dim, *weight.shape[1:])
    return w[:, perm.to(weight.device)].reshape(weight.shape).clone()


def rerotate_keys(
    keys: torch.Tensor,
    delta,
    rotary=None,
    *,
    inv_freq: torch.Tensor | None = None,
    layout: str | None = None,
    context_len: int | None = None,
) -> torch.Tensor:
    """Move already rotated keys by ``delta`` positions: rotate(k, p) -> rotate(k, p + delta).

    Args:
        keys: (..., seq, head_dim), rotated at some positions p (attention factor included or not: it is untouched).
        delta: a number, or a tensor (seq,) or (batch, seq) with one shift per key; negative shifts move keys
            back (e.g. after evicting cache entries in front of them). Fractional shifts are allowed.
        rotary: the :class:`posenc.RotaryEmbedding` that rotated the keys (gives inv_freq and layout), or None
            with ``inv_freq`` (rotary_dim/2,) and ``layout`` given instead.
        context_len: for length-dependent methods (dynamic NTK, dynamic YaRN, LongRoPE), the length whose
            frequencies the keys were rotated with.

    Returns:
        keys rotated by delta * omega_k in every pair, same shape and dtype. Angles are formed in float64.
    """
    _checks.tensor_rank("keys", keys, 2)
    if rotary is not None:
        if inv_freq is not None:
            raise ValueError("pass either rotary or inv_freq, not both")
        inv64 = rotary.frequencies(context_len)[0] if context_len is not None else rotary._inv_freq64
        layout = rotary.layout if layout is None else layout
        if keys.shape[-1] != rotary.head_dim:
            raise ValueError(f"keys must have last dimension head_dim={rotary.head_dim}, got shape {tuple(keys.shape)}")
    else:
        if inv_freq is None or layout is None:
            raise ValueError("rerotate_keys needs rotary=RotaryEmbedding, or both inv_freq and layout")
        inv64 = torch.as_tensor(inv_freq).to(torch.float64)
        if inv64.dim() != 1 or 2 * inv64.shape[0] > keys.shape[-1]:
            raise ValueError(f"inv_freq must have shape (rotary_dim/2,) with rotary_dim <= {keys.shape[-1]}, got {tuple(inv64.shape)}")
    _checks.layout(layout)
    seq = keys.shape[-2]
    if isinstance(delta, torch.Tensor):
        if delta.dim() not in (0, 1, 2) or (delta.dim() > 0 and delta.shape[-1] != seq):
            raise ValueError(f"delta must be a number or a tensor of shape ({seq},) or (batch, {seq}), got {tuple(delta.shape)}")
        d = delta.to(device=keys.device, dtype=torch.float64)
    elif isinstance(delta, (int, float)) and not isinstance(delta, bool):
        d = torch.tensor(float(delta), dtype=torch.float64, device=keys.device)
    else:
        raise ValueError(f"delta must be a number or a tensor, got {type(delta).__name__}")
    if not bool(torch.isfinite(d).all()):
        raise ValueError("delta must be finite, got NaN or inf")
    if d.dim() == 0:
        d = d.expand(seq)
    theta = d[..., None] * inv64.to(keys.device)  # (seq, r/2) or (batch, seq, r/2)
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    cos, sin = torch.cos(theta).to(work), torch.sin(theta).to(work)
    if cos.dim() == 3:  # line batch up with keys' first axis, broadcast over heads
        if keys.dim() < 3 or cos.shape[0] not in (1, keys.shape[0]):
            raise ValueError(f"delta of shape {tuple(delta.shape)} does not match keys of shape {tuple(keys.shape)}")
        shape = (cos.shape[0],) + (1,) * (keys.dim() - 3) + cos.shape[1:]
        cos, sin = cos.reshape(shape), sin.reshape(shape)
    return apply_rotary(keys, cos, sin, layout=layout)
