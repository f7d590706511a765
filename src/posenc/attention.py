"""One attention entry point that applies any positional scheme on the best kernel available.

``attention(q, k, v, rotary=..., bias=...)`` rotates q and k with any rotary embedding
(:class:`~posenc.rope.protocol.RotaryProtocol`: RoPE on its fused kernels, :mod:`posenc.kernels`; xPos;
M-RoPE; axial RoPE), then attends:

* no bias (RoPE, absolute, none): ``F.scaled_dot_product_attention`` (flash kernels on CPU and CUDA).
* a :class:`~posenc.bias.base.ScoreBias` (ALiBi, Press et al. 2021, arxiv.org/abs/2108.12409; T5, KERPLE,
  Sandwich, FIRE, ...), never materialising (heads, L, L):
  - CUDA: FlexAttention with the bias's ``score_mod`` and a causal block mask, compiled once per process.
  - CPU: the bias's ``blocked_attention``: torch's CPU flash kernel on blocks of queries, forward and
    backward, O(L) memory per head; :mod:`posenc.kernels.bias_blocked` (one kernel for every bias), or
    for ALiBi :mod:`posenc.kernels.alibi_blocked`, the bias folded into an appended head dimension.
  - few queries (decoding), and training a bias's parameters at short lengths: the materialised bias and
    SDPA, faster there (:func:`bias_backend`; the crossovers are measured by ``posenc bench --only
    crossover``).
* a :class:`~posenc.bias.content.ContentBias` (Shaw et al.'s relative representations, CoPE, and the per-call
  biases of the hidden state: FoX's ForgetBias, Inkling's BandedBias), whose terms
  depend on the query content: its own ``attend``, blocks of queries under a checkpoint
  (:mod:`posenc.kernels.query_blocked`), O(L) memory per head, on every device.
* a bias tensor: added as given (it is already materialised).

With ``remap=`` (:mod:`posenc.remap`: SelfExtend, ReRoPE, STRING), causal RoPE attention at remapped
distances: q and k are rotated once per view of the remap and attended block by block of queries. With
``sinks=`` (a learned logit per head), every softmax row has one more entry with no value; it runs on the
same kernels. Data-dependent position terms come through ``bias=`` as content biases made per call from the
hidden state: a :class:`~posenc.bias.forget.ForgetGate`'s :class:`~posenc.bias.forget.ForgetBias`
(Forgetting Attention, FoX, Lin et al. 2025, arxiv.org/abs/2503.02130: the causal decay bias
sum_{l=j+1..i} log f_l) and a :class:`~posenc.bias.banded.BandedRelative`'s
:class:`~posenc.bias.banded.BandedBias` (Inkling's banded relative bias r_i . P[:, i - j] over the last
``extent`` keys), after ``rotary`` if one is given.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import _checks
from .bias.base import ScoreBias
from .bias.content import ContentBias
from .kernels.flex import flex_attention
from .remap import NoRemap, Remap, remap_attention
from .rope import RotaryEmbedding
from .rope.protocol import RotaryProtocol, is_rotary

__all__ = ["attention", "alibi_backend", "bias_backend"]

# SDPA given a materialised float bias on the CPU holds about this many (batch, heads, q_len, k_len) float32
# tensors at its peak (measured: 2.3 forward, 3.2 forward + backward); above MATERIALISED_BYTES of them the
# blocked kernel's O(L) memory is taken whatever the speed.
_SDPA_COPIES = 4
MATERIALISED_BYTES = 256 << 20
# Below this many queries the blocked kernels are mostly fixed cost (a decode step, a short chunk): the
# materialised (heads, q_len, k_len) bias and SDPA measured 1.2-8x faster at q_len 1-16, the blocked kernel
# faster from q_len 64 (docs/fast-paths.md).
DECODE_QUERIES = 32

_block_masks: dict = {}  # (q_len, k_len, device) -> causal BlockMask; it depends on nothing else


def bias_backend(q: torch.Tensor, k: torch.Tensor, bias: ScoreBias | None = None) -> str:
    """Which path :func:`attention` takes for a score bias: "flex" on CUDA; on the CPU "blocked" (the
    bias's O(L) kernel, the faster one whenever its blocks of queries have work to do) unless SDPA with the
    materialised bias is faster and its scores fit ``MATERIALISED_BYTES``: for fewer than
    ``DECODE_QUERIES`` queries, and while ``bias``'s parameters are trained up to its ``materialise_max``
    scores (measured per bias: ``posenc bench --only crossover``)."""
    if q.is_cuda:
        return "flex"
    scores = q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2]
    if scores * 4 * _SDPA_COPIES > MATERIALISED_BYTES:
        return "blocked"
    if q.shape[-2] < DECODE_QUERIES:
        return "materialise"
    if bias is not None and scores <= bias.materialise_max and _trains(bias):
        return "materialise"
    return "blocked"


def _trains(bias: ScoreBias) -> bool:
    """Whether this call records gradients for the bias's parameters."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in bias.parameters())


def alibi_backend(q: torch.Tensor, k: torch.Tensor, alibi: ScoreBias | None = None) -> str:
    """Which ALiBi path :func:`attention` takes for these tensors: "flex", "materialise" or "blocked"."""
    return bias_backend(q, k, alibi)


def _flex_attention(q, k, v, bias, causal: bool, scale: float, enable_gqa: bool) -> torch.Tensor:
    """FlexAttention with ``bias.score_mod`` and a cached bottom-right causal block mask (CUDA)."""
    from torch.nn.attention.flex_attention import create_block_mask

    q_len, k_len = q.shape[-2], k.shape[-2]
    block_mask = None
    if causal:
        key = (q_len, k_len, str(q.device))
        if key not in _block_masks:
            if len(_block_masks) >= 16:
                _block_masks.clear()
            _block_masks[key] = create_block_mask(
                bias.mask_mod(q_len, k_len), None, None, q_len, k_len, device=q.device
            )
        block_mask = _block_masks[key]
    return flex_attention()(
        q,
        k,
        v,
        score_mod=bias.score_mod(q_len, k_len, causal),
        block_mask=block_mask,
        scale=scale,
        enable_gqa=enable_gqa,
    )


def _bias_attention(q, k, v, bias, causal: bool, scale: float, enable_gqa: bool) -> torch.Tensor:
    """A ScoreBias: FlexAttention on CUDA, the materialised bias when tiny, else the bias's blocked kernel."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    name = type(bias).__name__
    if bias.n_heads != q.shape[1]:
        raise ValueError(f"{name} has n_heads={bias.n_heads}, but q has {q.shape[1]} heads")
    if not causal and q_len > k_len:
        raise ValueError(
            f"{name} needs q_len <= k_len (queries are the last q_len keys), got {q_len} > {k_len}"
        )
    backend = bias_backend(q, k, bias)
    if backend == "flex":
        return _flex_attention(q, k, v, bias, causal, scale, enable_gqa)
    if backend == "materialise":
        mask = bias.bias(q_len, k_len, causal=causal).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return bias.blocked_attention(q, k, v, causal, scale)


def _causal_mask(q_len: int, k_len: int, device) -> torch.Tensor:
    """Boolean (q_len, k_len), True where allowed; queries are the last q_len of k_len positions."""
    qi = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= qi


def _check_qkv(q, k, v, causal: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.tensor_rank(name, t, 4)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, seq, dim), got {tuple(t.shape)}")
    if k.shape[-2] != v.shape[-2] or k.shape[1] != v.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(
            f"k and v must have the same batch, heads and length, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same batch size and head_dim, got q {tuple(q.shape)} and k "
            f"{tuple(k.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q's head count {q.shape[1]} must be a multiple of k's {k.shape[1]}")
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"causal attention needs q_len <= k_len, got {q.shape[-2]} > {k.shape[-2]}")


def _mask_tensor(bias: torch.Tensor, q: torch.Tensor, causal: bool, k_len: int):
    """A bias tensor as SDPA's attn_mask: boolean True = may attend; float added to the scores.

    Returns (mask, rows): rows is None, or for a boolean mask the (..., q_len, 1) rows that may attend to
    some key (a row that may attend to none gets zeros, not the NaN of a softmax over nothing).
    """
    if bias.dtype == torch.bool:
        mask = bias if not causal else bias & _causal_mask(q.shape[-2], k_len, q.device)
        return mask, mask.any(-1, keepdim=True)
    if not bias.is_floating_point():
        raise ValueError(
            f"bias must be a boolean mask (True = may attend) or a float tensor added to the scores, "
            f"got dtype {bias.dtype}"
        )
    mask = bias.to(q.dtype)
    if causal:
        mask = mask.masked_fill(~_causal_mask(q.shape[-2], k_len, q.device), -math.inf)
    return mask, None


def _rotate(rotary, q, k, positions, k_positions, offset):
    """q and k rotated by any :class:`RotaryProtocol` (RoPE keeps its fused kernels: this is its own call),
    or as they are without one."""
    if rotary is None:
        if positions is not None or k_positions is not None or offset:
            raise ValueError(
                "positions, k_positions and offset are only used with rotary=; got them without a rotary "
                "embedding"
            )
        return q, k
    if not is_rotary(rotary):
        raise ValueError(
            "rotary must be a posenc rotary embedding (RotaryEmbedding, XPos, MRotaryEmbedding, "
            f"AxialRotaryEmbedding: any posenc.RotaryProtocol) or None, got {type(rotary).__name__}"
        )
    return rotary(q, k, positions=positions, k_positions=k_positions, offset=offset)


def _tensor_bias_attention(q, k, v, bias, causal: bool, scale: float, enable_gqa: bool) -> torch.Tensor:
    """A materialised bias: a boolean mask or float scores, checked to broadcast to (batch, heads, q, k)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    want = (q.shape[0], q.shape[1], q_len, k_len)
    try:
        broadcast = torch.broadcast_shapes(bias.shape, want)
    except RuntimeError:
        broadcast = None
    if broadcast != want:
        raise ValueError(
            f"bias must broadcast to (batch, heads, q_len, k_len) = {want}, got shape {tuple(bias.shape)}"
        )
    mask, rows = _mask_tensor(bias, q, causal, k_len)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return out if rows is None else out.masked_fill(~rows, 0.0)


def _attend(q, k, v, bias, causal: bool, scale: float) -> torch.Tensor:
    """Rotated q, k and v attended with ``bias``: the path for each kind of bias (module docstring)."""
    enable_gqa = True if q.shape[1] != k.shape[1] else False  # a plain bool even for symbolic head counts
    q_len, k_len = q.shape[-2], k.shape[-2]
    if bias is None:
        if causal and q_len != k_len:
            mask = _causal_mask(q_len, k_len, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa)
    if isinstance(bias, ScoreBias):
        return _bias_attention(q, k, v, bias, causal, scale, enable_gqa)
    if isinstance(bias, ContentBias):
        return bias.attend(q, k, v, causal=causal, scale=scale)
    if not isinstance(bias, torch.Tensor):
        raise ValueError(
            f"bias must be an ALiBi module, a ScoreBias (T5Bias, KerpleBias, SandwichBias, FireBias), a "
            f"ContentBias (ShawRelative, CoPE, ForgetBias, BandedBias), a tensor or None, got "
            f"{type(bias).__name__}"
        )
    return _tensor_bias_attention(q, k, v, bias, causal, scale, enable_gqa)


def _remap_attention(q, k, v, rotary, remap, bias, causal, positions, k_positions, offset, scale, sinks):
    if sinks is not None:
        if not causal:
            raise ValueError("sinks= works with causal attention only")
        if remap is None:
            if rotary is not None and not isinstance(rotary, RotaryEmbedding):
                raise ValueError(
                    f"rotary must be a posenc.RotaryEmbedding or None, got {type(rotary).__name__}"
                )
            if bias is not None:
                raise ValueError(f"sinks= takes no bias (got {type(bias).__name__}); pass one or the other")
            if positions is not None or k_positions is not None or (rotary is None and offset):
                raise ValueError(
                    "sinks= takes positions from offset= (with rotary=): positions= and k_positions= are not "
                    "supported with it"
                )
            remap = NoRemap()
    if not isinstance(remap, Remap):
        raise ValueError(
            f"remap must be a posenc.remap.Remap (SelfExtend, ReRoPE, STRING) or None, got {remap!r}"
        )
    if not isinstance(rotary, RotaryEmbedding) and not (rotary is None and isinstance(remap, NoRemap)):
        raise ValueError(
            f"remap={remap!r} remaps RoPE distances: it needs rotary=posenc.RotaryEmbedding(...), got "
            f"rotary={type(rotary).__name__ if rotary is not None else None}"
        )
    if not causal:
        raise ValueError(
            f"remap={remap!r} is defined for causal attention only (keys at or before the query)"
        )
    if bias is not None:
        raise ValueError(f"remap={remap!r} takes no bias (got {type(bias).__name__}); pass one or the other")
    if positions is not None or k_positions is not None:
        raise ValueError(
            f"remap={remap!r} takes positions from offset= (keys offset.., queries the last of them); "
            "positions= and k_positions= are not supported with it"
        )
    return remap_attention(q, k, v, rotary, remap, offset=offset, scale=scale, sinks=sinks)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rotary: RotaryProtocol | None = None,
    bias: ScoreBias | ContentBias | torch.Tensor | None = None,
    causal: bool = True,
    positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    offset: int = 0,
    scale: float | None = None,
    remap: Remap | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with a positional scheme applied.

    Args:
        q: (batch, heads, q_len, head_dim); k: (batch, kv_heads, k_len, head_dim);
            v: (batch, kv_heads, k_len, v_dim). kv_heads may divide heads (grouped-query attention).
        rotary: a rotary embedding that rotates q and k before attending, anything implementing
            :class:`~posenc.rope.protocol.RotaryProtocol`: a :class:`RotaryEmbedding` or :class:`XPos`; an
            :class:`MRotaryEmbedding` (multimodal RoPE), which takes ``positions`` as (3, batch, q_len)
            time/height/width ids and the keys' ``k_positions`` when their length differs; an
            :class:`AxialRotaryEmbedding`, which takes (N, axes) grid coordinates as ``positions``.
        bias: a score bias (:class:`~posenc.bias.base.ScoreBias`: ALiBi, T5Bias, KerpleBias, SandwichBias,
            FireBias); a content bias
            (:class:`~posenc.bias.content.ContentBias`: ShawRelative, CoPE; a ForgetGate's ForgetBias and a
            BandedRelative's BandedBias, made per call from the hidden state, causal only, gradients flowing
            to the gates and to r and P); a boolean mask broadcastable to
            (batch, heads, q_len, k_len), True where a query may attend (as ``scaled_dot_product_attention``'s
            ``attn_mask``); or a float tensor added to the scores.
        causal: a query sees only keys at or before it (with q_len < k_len, queries are the last positions).
        positions: (q_len,) or (batch, q_len) query positions for the rotary embedding (M-RoPE and axial:
            theirs, above); default: the last q_len of the key positions.
        k_positions: (k_len,) or (batch, k_len) key positions (batched decoding with left padding); default
            ``positions`` when q and k have one length, else offset .. offset+k_len-1.
        offset: position of the first key when no positions are given (decoding with a cache of unrotated
            keys: 0; a sliding chunk: its start); 1-D RoPE and xPos only.
        scale: score scale, default 1/sqrt(head_dim) (T5 uses 1.0).
        remap: a :class:`~posenc.remap.Remap` (SelfExtend, ReRoPE, STRING): training-free context extension,
            ``rotary``'s RoPE at remapped distances; q and k unrotated (with a cache: unrotated keys), causal,
            positions from ``offset``.
        sinks: (heads,) learned logits, one more entry of every softmax row per head with no value
            (attention sinks, as in GPT-OSS and flash-attention's ``learnable_sink``); causal, without a
            bias, with or without ``rotary``/``remap``; gradients flow to them.
    Returns:
        (batch, heads, q_len, v_dim).
    """
    causal = _checks.boolean("causal", causal)
    _check_qkv(q, k, v, causal)
    offset = _checks.offset(offset)
    scale = None if scale is None else _checks.scale(scale)
    if remap is not None or sinks is not None:
        return _remap_attention(
            q, k, v, rotary, remap, bias, causal, positions, k_positions, offset, scale, sinks
        )
    q, k = _rotate(rotary, q, k, positions, k_positions, offset)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if q.shape[-2] == 0:  # empty in, empty out, whatever the scheme
        return q.new_empty(*q.shape[:-1], v.shape[-1])
    return _attend(q, k, v, bias, causal, scale)
