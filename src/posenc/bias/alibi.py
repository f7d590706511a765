"""ALiBi (Press, Smith & Lewis 2021, arxiv.org/abs/2108.12409): a :class:`~.base.ScoreBias` whose distance
table is -m_h |d|, with a CPU kernel of its own."""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from .base import ScoreBias, check_lengths

__all__ = ["alibi_slopes", "ALiBi"]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2021), float32 of shape (n_heads,).

    For a power of two H: m_h = 2^(-8h/H), h = 1..H. Otherwise, as the paper's code does: the P slopes of
    the largest power of two P below H, then the odd-numbered slopes of the schedule for 2P,
    2^(-8i/(2P)) for i = 1, 3, 5, ..., until there are H (they fall between the first P, so every head
    keeps a distinct slope).
    """
    n_heads = _checks.positive_int("n_heads", n_heads, size=True)
    p = 1 << (n_heads.bit_length() - 1)
    exponents = torch.cat(
        (
            torch.arange(1, p + 1, dtype=torch.float64) * (8.0 / p),
            (2 * torch.arange(n_heads - p, dtype=torch.float64) + 1) * (4.0 / p),
        )
    )
    return torch.pow(2.0, -exponents).to(torch.float32)


class ALiBi(ScoreBias):
    """Attention with Linear Biases: score_ij += -m_h * |i - j|, a head-specific slope m_h.

    Args:
        n_heads: number of attention heads.
        slopes: optional (n_heads,) positive slopes; default :func:`alibi_slopes`.
        learnable: make the slopes a trainable parameter (stored as logarithms, so they stay positive).

    A table :class:`~.base.ScoreBias`: :meth:`table` is -m_h |d| at signed distances d = i - j.
    ``bias(q_len, k_len, causal)`` returns the (n_heads, q_len, k_len) bias. Queries are the *last*
    ``q_len`` of the ``k_len`` positions (as when decoding with a KV cache). With ``causal=True``
    keys after the query get -inf (the bias doubles as the causal mask); with ``causal=False`` the
    symmetric -m_h * |i - j| of an encoder. :func:`posenc.attention` uses the slopes directly and never
    builds this tensor (FlexAttention with :meth:`score_mod` on CUDA, :meth:`blocked_attention` on the
    CPU); ``bias`` is for inspection and small inputs.
    """

    # Learnable slopes get their gradient from two columns appended in ALiBi's own blocked kernel, with no
    # score-gradient recompute, so training never needs the materialised bias.
    materialise_max = 0

    precise_buffers = ("_slopes",)

    def __init__(self, n_heads: int, slopes=None, learnable: bool = False):
        super().__init__()
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        if slopes is None:
            init = alibi_slopes(n_heads)
        else:
            try:
                init = torch.as_tensor(slopes, dtype=torch.float32).detach().clone()
            except (TypeError, ValueError, RuntimeError):
                raise ValueError(
                    f"slopes must be a sequence or tensor of {n_heads} positive numbers, got {slopes!r}"
                ) from None
            if init.shape != (n_heads,):
                raise ValueError(
                    f"slopes must have shape ({n_heads},) for n_heads={n_heads}, got {tuple(init.shape)}"
                )
            if not bool(torch.isfinite(init).all()) or bool((init <= 0).any()):
                raise ValueError(f"slopes must be finite and > 0, got {init.tolist()}")
        self.learnable = bool(learnable)
        # The names are those of checkpoints saved before ALiBi was a ScoreBias: a learnable module's
        # state_dict holds "log_slopes"; the fixed slopes are a non-persistent buffer, in none.
        if self.learnable:
            self.log_slopes = nn.Parameter(init.log())
        else:
            self.register_buffer("_slopes", init, persistent=False)

    @property
    def slopes(self) -> torch.Tensor:
        """(n_heads,) positive slopes, float32."""
        return self.log_slopes.exp() if self.learnable else self._slopes

    def table(self, distance: torch.Tensor) -> torch.Tensor:
        """(n_heads, n) bias -m_h |d| at the signed distances ``distance`` (n,), float32."""
        return -self.slopes[:, None] * distance.abs()[None]

    def distance(self, q_len: int, k_len: int | None = None, device=None) -> torch.Tensor:
        """Signed distance i - j, float32 (q_len, k_len); queries are the last q_len positions."""
        q_len, k_len = check_lengths(q_len, k_len)
        device = self.slopes.device if device is None else device
        qi = torch.arange(k_len - q_len, k_len, device=device, dtype=torch.float32)
        kj = torch.arange(k_len, device=device, dtype=torch.float32)
        return qi[:, None] - kj[None, :]

    def bias(self, q_len: int, k_len: int | None = None, causal: bool = True) -> torch.Tensor:
        """The materialised bias, float32 (n_heads, q_len, k_len): ScoreBias's, computed in closed form from
        :meth:`distance` (the same numbers; ~10 us less per call than the generic tile lookup, which is the
        whole cost of attention's materialised path on small inputs)."""
        d = self.distance(q_len, k_len)
        out = -self.slopes[:, None, None] * d.abs()[None]
        if causal:
            out = out.masked_fill((d < 0)[None], -math.inf)
        return out

    def score_mod(self, q_len: int, k_len: int | None = None, causal: bool = True):
        """A FlexAttention ``score_mod`` adding this bias without materialising it.

        ``score_mod(score, b, h, q_idx, kv_idx) -> score - m_h |i - j|``, with query index q_idx at position
        ``q_idx + k_len - q_len`` (bottom-right alignment, as :meth:`bias`); with ``causal=True`` later
        keys get -inf. For speed pair it with :meth:`mask_mod` in a block mask, so fully masked tiles are
        skipped. The slopes are used as they are, not a table looked up by distance: one multiply per score.
        """
        q_len, k_len = check_lengths(q_len, k_len)
        shift = k_len - q_len
        slopes = self.slopes

        def alibi_score_mod(score, b, h, q_idx, kv_idx):
            d = q_idx + shift - kv_idx
            biased = score - slopes[h] * torch.abs(d)
            if causal:
                biased = torch.where(d >= 0, biased, -math.inf)
            return biased

        return alibi_score_mod

    def blocked_attention(self, q, k, v, causal: bool, scale: float) -> torch.Tensor:
        """ALiBi's own CPU kernel (:mod:`posenc.kernels.alibi_blocked`): the bias is linear in the key
        position, so it rides in one more head dimension of the flash kernel instead of a table per block."""
        from ..kernels.alibi_blocked import alibi_attention_blocked

        return alibi_attention_blocked(q, k, v, self.slopes, causal=causal, scale=scale)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, learnable={self.learnable}"
