"""Re-rotating cached keys, and a key/value cache that keeps RoPE consistent when the schedule changes.

:func:`rerotate_keys` shifts keys that are already rotated by ``delta`` positions: R(p + d) = R(d) R(p)
because the 2x2 rotations of one pair commute, so a cache can move keys (eviction, attention sinks,
StreamingLLM) without keeping unrotated copies. :func:`rerotate_schedule` turns keys from one frequency
schedule to another the same way.

Length-dependent methods (dynamic NTK, dynamic YaRN, LongRoPE) choose their frequencies from the current
sequence length L. A full forward pass over L tokens rotates every query and key with the schedule for
L. Hugging Face transformers, decoding token by token, rotates each new key with the schedule of the
moment and caches it rotated: the key at position j keeps the schedule for length j + 1 while the query
at L uses the schedule for L, so q.k no longer depends on L - j alone and decoding differs from the full
forward pass at the same length.

:class:`RotaryKVCache` offers three modes:

- ``"unrotated"``: cache keys before rotation and rotate the whole cache with the current schedule at
  every step. Exact: the attention of the new token equals that of a full forward pass at the same length.
  Costs one rotation of the cached keys per step (elementwise, small next to attention itself).
- ``"rerotate"``: cache rotated keys; when the schedule changes, turn the cached keys from the old schedule
  to the new one (angle p (omega_new - omega_old), attention factor ratio). Equal to "unrotated" up to
  float rounding; costs nothing while the schedule stays the same (static methods, or up to the original
  context), one rotation of the cache when it changes. Half-precision keys are kept in float32, so that
  turning them again and again never rounds them again (returned in the input's dtype).
- ``"hf"``: transformers' behaviour, for comparison.

xPos (:class:`posenc.XPos`, Sun et al. 2022) scales queries and keys about a centre c as well as
rotating them. The cache scales the new queries as queries and the keys as keys, with the module's fixed
centre; without one, ``"unrotated"`` uses the centre a full forward pass over the cached length would
(the middle of the keys), and the modes that keep scaled keys refuse it, since keys scaled with one
centre only meet queries scaled with the same one. :func:`rerotate_keys` given an XPos moves the keys'
scale with their position too.

For a single attention layer "unrotated" and "rerotate" make token-by-token decoding equal a full forward
pass. In a deep model the hidden states of earlier tokens, and so the keys and values of later layers,
were still computed when the sequence was shorter; no cache can change that without recomputing them.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..kernels import apply_rotary
from .checks import check_fits
from .embedding import RotaryEmbedding
from .table import align_to, cos_sin_of

__all__ = ["RotaryKVCache", "rerotate_keys", "rerotate_schedule", "same_schedule"]

MODES = ("unrotated", "rerotate", "hf")


class RotaryKVCache:
    """Keys and values of one attention layer, with RoPE applied consistently (see the module docstring).

    Args:
        rotary: the layer's :class:`posenc.RotaryEmbedding`.
        mode: "unrotated" (default), "rerotate" or "hf".

    Shape:
        update(q, k, v) takes the new tokens, each (batch, heads, new, head_dim) (k, v may have fewer heads),
        positions continuing after the cached ones, and returns (q rotated, all keys rotated, all values),
        keys and values (batch, kv_heads, length, head_dim).
    """

    def __init__(self, rotary: RotaryEmbedding, mode: str = "unrotated"):
        if not isinstance(rotary, RotaryEmbedding):
            raise ValueError(f"rotary must be a posenc.RotaryEmbedding, got {type(rotary).__name__}")
        self.rotary = rotary
        self.mode = _checks.one_of("mode", mode, MODES)
        rotary.check_cache_mode(self.mode)
        self.keys: torch.Tensor | None = None  # rotated (rerotate, hf) or not (unrotated)
        self.values: torch.Tensor | None = None
        self._schedule: tuple[torch.Tensor, float] | None = (
            None  # (inv_freq64, attention factor) of cached keys
        )

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def reset(self) -> None:
        self.keys = self.values = self._schedule = None

    def update(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for name, t in (("q", q), ("k", k), ("v", v)):
            _checks.tensor_rank(name, t, 3)
        if not q.shape[-2] == k.shape[-2] == v.shape[-2]:
            raise ValueError(
                f"q, k and v must hold the same new tokens, got lengths {q.shape[-2]}, {k.shape[-2]}, "
                f"{v.shape[-2]}"
            )
        if self.keys is not None and (
            k.shape[:-2] != self.keys.shape[:-2] or v.shape[:-2] != self.values.shape[:-2]
        ):
            raise ValueError(
                f"k and v must keep the cached (batch, kv_heads) = {tuple(self.keys.shape[:-2])}, got k "
                f"{tuple(k.shape)} and v {tuple(v.shape)}; reset() the cache to start another batch"
            )
        start = self.length
        total = start + k.shape[-2]
        rot = self.rotary
        schedule = rot.frequencies(total)  # the schedule a full forward pass over `total` tokens uses
        q_rot = rot.rotate_cached(q, start, total, "q")
        self.values = v if self.values is None else torch.cat((self.values, v), dim=-2)
        if self.mode == "unrotated":
            self.keys = k if self.keys is None else torch.cat((self.keys, k), dim=-2)
            return q_rot, rot.rotate_cached(self.keys, 0, total, "k"), self.values
        if self.mode == "rerotate":
            # Kept in float32 (float64 stays): re-rotating half-precision keys at every schedule change would
            # round them again each time, and they would drift (2.25 after 600 dynamic-NTK steps in bf16).
            if self.keys is not None and not same_schedule(schedule, self._schedule):
                self.keys = rerotate_schedule(self.keys, self._schedule, schedule, rot.layout)
            k_rot = rot.rotate_cached(k.to(_precise(k.dtype)), start, total, "k")
        else:
            k_rot = rot.rotate_cached(k, start, total, "k")
        self.keys = k_rot if self.keys is None else torch.cat((self.keys, k_rot), dim=-2)
        self._schedule = schedule
        return q_rot, self.keys.to(k.dtype), self.values


def _precise(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision; float32 and float64 as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


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
        keys: (..., seq, head_dim), rotated at some positions p (attention factor included or not: it is
            untouched).
        delta: a number, or a tensor (seq,) or (batch, seq) with one shift per key; negative shifts move keys
            back (e.g. after evicting cache entries in front of them). Fractional shifts are allowed.
        rotary: the :class:`posenc.RotaryEmbedding` that rotated the keys (gives inv_freq and layout), or None
            with ``inv_freq`` (rotary_dim/2,) and ``layout`` given instead.
        context_len: for length-dependent methods (dynamic NTK, dynamic YaRN, LongRoPE), the length whose
            frequencies the keys were rotated with.

    Returns:
        keys rotated by delta * omega_k in every pair, same shape and dtype. Angles are formed in float64.
        A rotary that also scales keys by position (:class:`posenc.XPos`, its ``shift_scale``) moves their
        scale as well: each pair is multiplied by zeta_i^(-delta / scale_base).
    """
    _checks.tensor_rank("keys", keys, 2)
    if rotary is not None and not isinstance(rotary, RotaryEmbedding):
        raise ValueError(f"rotary must be a posenc.RotaryEmbedding or None, got {type(rotary).__name__}")
    if rotary is not None:
        if inv_freq is not None:
            raise ValueError("pass either rotary or inv_freq, not both")
        inv64 = rotary.frequencies(context_len)[0]
        layout = rotary.layout if layout is None else layout
        if keys.shape[-1] != rotary.head_dim:
            raise ValueError(
                f"keys must have last dimension head_dim={rotary.head_dim}, got shape {tuple(keys.shape)}"
            )
    else:
        if inv_freq is None or layout is None:
            raise ValueError("rerotate_keys needs rotary=RotaryEmbedding, or both inv_freq and layout")
        inv64 = torch.as_tensor(inv_freq).to(torch.float64)
        if inv64.dim() != 1 or 2 * inv64.shape[0] > keys.shape[-1]:
            raise ValueError(
                f"inv_freq must have shape (rotary_dim/2,) with rotary_dim <= {keys.shape[-1]}, got "
                f"{tuple(inv64.shape)}"
            )
    _checks.layout(layout)
    seq = keys.shape[-2]
    d = _delta(delta, seq, keys.device)
    if d.dim() == 0:
        d = d.expand(seq)
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    cos, sin = cos_sin_of(d, inv64, 1.0, work)
    scale = None if rotary is None else rotary.shift_scale(d)
    if scale is not None:
        if _checks.can_read(scale) and scale.numel():
            check_fits(
                keys.dtype, work, scale, "the shift is too long for it; shift less or use a wider dtype"
            )
        cos, sin = cos * scale.to(work), sin * scale.to(work)
    cos, sin = align_to(cos, sin, keys, "delta")
    return apply_rotary(keys, cos, sin, layout=layout)


def _delta(delta, seq: int, device) -> torch.Tensor:
    """The shift as a float64 tensor: a number, or (seq,) / (batch, seq) with one shift per key."""
    if isinstance(delta, torch.Tensor):
        if delta.dim() not in (0, 1, 2) or (delta.dim() > 0 and delta.shape[-1] != seq):
            raise ValueError(
                f"delta must be a number or a tensor of shape ({seq},) or (batch, {seq}), got "
                f"{tuple(delta.shape)}"
            )
        d = delta.to(device=device, dtype=torch.float64)
    elif isinstance(_checks.plain(delta), (int, float)) and not isinstance(delta, bool):
        d = torch.tensor(float(_checks.plain(delta)), dtype=torch.float64, device=device)
    else:
        raise ValueError(f"delta must be a number or a tensor, got {type(delta).__name__}")
    if _checks.can_read(d) and not bool(torch.isfinite(d).all()):
        raise ValueError("delta must be finite, got NaN or inf")
    return d


def rerotate_schedule(keys: torch.Tensor, old, new, layout: str) -> torch.Tensor:
    """Keys rotated with schedule ``old`` at positions 0..n-1 -> the same keys rotated with ``new``.

    ``old``, ``new``: (inv_freq float64 (rotary_dim/2,), attention factor), as RotaryEmbedding.frequencies
    returns them. keys: (..., n, head_dim). Rotation by p (omega_new - omega_old) times the attention
    factor ratio, formed in float64 (the frequency difference is small; float32 would lose it).
    """
    (inv_old, a_old), (inv_new, a_new) = old, new
    positions = torch.arange(keys.shape[-2], dtype=torch.float64, device=keys.device)
    turned = rerotate_keys(keys, positions, inv_freq=inv_new - inv_old, layout=layout)
    ratio = float(a_new) / float(a_old)
    if ratio != 1.0:  # the attention factor scales the rotated dimensions only, as it scales cos and sin
        turned[..., : 2 * inv_new.shape[-1]].mul_(ratio)
    return turned


def same_schedule(a, b) -> bool:
    """Whether two (inv_freq, attention factor) schedules are identical (b may be None)."""
    return b is not None and float(a[1]) == float(b[1]) and torch.equal(a[0], b[0])
