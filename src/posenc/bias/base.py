"""The score-bias protocol: an object that gives the additive bias b_h(i, j) of head h, query position i and
key position j.

Two granularities, one interface:

* **table biases** (ALiBi, T5, KERPLE, Sandwich): b_h(i, j) depends on i - j only. A subclass implements
  :meth:`ScoreBias.table`, the (n_heads, n) bias at n signed distances; attention looks values up in one
  (n_heads, 2 k_len - 1) table, and the gradient of a table entry is the sum of the score gradients dS along
  its diagonal.
* **tile biases** (FIRE, whose normaliser depends on the query position): a subclass sets ``per_tile = True``
  and implements :meth:`ScoreBias.tile`, the (n_heads, nq, nk) bias of a block of queries and keys.

:func:`posenc.attention` runs a bias on FlexAttention (:meth:`ScoreBias.score_mod`) on CUDA, materialised
(:meth:`ScoreBias.bias`) when tiny, else on :meth:`ScoreBias.blocked_attention`: one blocked CPU kernel
for every bias (:mod:`posenc.kernels.bias_blocked`), which a bias with a faster kernel of its own
overrides (ALiBi: :mod:`posenc.kernels.alibi_blocked`).

Positions are absolute: with q_len < k_len the queries are the *last* q_len of the k_len positions
(decoding with a KV cache), for :meth:`bias`, :meth:`score_mod` and :func:`posenc.attention` alike.
"""

from __future__ import annotations

import math

import torch

from .. import _checks
from .._precision import KeepsPrecision

__all__ = ["MATERIALISE_MAX", "ScoreBias", "check_lengths"]

# The default ScoreBias.materialise_max: in training, a bias with parameters is materialised on the CPU up to
# this many scores (batch x heads x q_len x k_len), where SDPA's backward beat the blocked kernel's per-block
# score-gradient recompute for T5, KERPLE and FIRE alike (posenc bench --only crossover).
MATERIALISE_MAX = 1 << 21


def check_lengths(q_len, k_len) -> tuple[int, int]:
    """(q_len, k_len) of a bias's ``bias``/``score_mod``/``mask_mod``: k_len defaults to q_len and may not be
    shorter (the queries are the last q_len keys)."""
    _checks.positive_int("q_len", q_len)
    k_len = q_len if k_len is None else _checks.positive_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(
            f"k_len must be >= q_len (queries are the last q_len keys), got k_len={k_len}, q_len={q_len}"
        )
    return q_len, k_len


class ScoreBias(KeepsPrecision):
    """Base class of additive score biases (see the module docstring).

    Subclasses set ``self.n_heads`` and implement :meth:`table` (``per_tile = False``) or :meth:`tile`
    (``per_tile = True``). ``tile_width`` is the number of floats per query-key pair (all heads together)
    that a tile bias holds while it computes a block; the blocked kernel sizes its blocks by it. The kernel
    walks a bias's blocks through :meth:`block_walker` over :meth:`walker_inputs` (the one hook,
    :mod:`posenc.kernels.block_walkers`); a bias with a faster walk of its own overrides it (FIRE sums its
    gradients by hand). Buffers named in
    ``precise_buffers`` keep their dtype under ``.half()`` (:mod:`posenc._precision`). ``materialise_max``:
    the scores (batch x heads x q_len x k_len) up to which :func:`posenc.attention` materialises the bias on
    the CPU while its parameters are being trained, instead of running :meth:`blocked_attention`, where that
    measured faster for the class (``posenc bench --only crossover``).
    """

    per_tile: bool = False
    tile_width: int = 1
    materialise_max: int = MATERIALISE_MAX

    def table(self, distance: torch.Tensor) -> torch.Tensor:
        """(n_heads, n) bias at the signed distances ``distance`` = i - j, a float tensor of shape (n,)."""
        raise NotImplementedError(f"{type(self).__name__} must implement table() or set per_tile = True")

    def tile(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(n_heads, nq, nk) bias of queries at ``q_pos`` (nq,) and keys at ``k_pos`` (nk,); no causal
        mask."""
        d = q_pos[:, None].to(torch.float32) - k_pos[None, :].to(torch.float32)
        return self.table(d.reshape(-1)).view(-1, *d.shape)

    def _device(self) -> torch.device:
        for t in self.parameters():
            return t.device
        for t in self.buffers():
            return t.device
        return torch.device("cpu")

    def distance_table(self, k_len: int, causal: bool = True, device=None) -> torch.Tensor:
        """(n_heads, 2 k_len - 1): entry t is the bias at distance i - j = t - (k_len - 1); with ``causal``
        the negative distances (keys after the query) are -inf. Differentiable in the bias's parameters."""
        device = self._device() if device is None else device
        if causal:
            tab = self.table(torch.arange(k_len, device=device, dtype=torch.float32))
            future = tab.new_full((tab.shape[0], k_len - 1), -math.inf)
            return torch.cat((future, tab), dim=1)
        return self.table(torch.arange(1 - k_len, k_len, device=device, dtype=torch.float32))

    def bias(self, q_len: int, k_len: int | None = None, causal: bool = True) -> torch.Tensor:
        """The materialised bias, (n_heads, q_len, k_len); with ``causal`` keys after the query get -inf."""
        q_len, k_len = check_lengths(q_len, k_len)
        device = self._device()
        q_pos = torch.arange(k_len - q_len, k_len, device=device)
        k_pos = torch.arange(k_len, device=device)
        if not self.per_tile:
            # a table bias takes each of its 2 k_len - 1 distances once and gathers them: evaluating the
            # table at all q_len x k_len scores (Sandwich: a sum of cosines each) was most of the
            # materialised path's time, and the gather's backward sums dS per distance
            return self.distance_table(k_len, causal=causal, device=device)[
                :, q_pos[:, None] - k_pos + k_len - 1
            ]
        out = self.tile(q_pos, k_pos)
        if causal:
            out = out.masked_fill((k_pos[None, :] > q_pos[:, None])[None], -math.inf)
        return out

    def forward(self, q_len: int, k_len: int | None = None, causal: bool = True) -> torch.Tensor:
        return self.bias(q_len, k_len, causal)

    def score_mod(self, q_len: int, k_len: int | None = None, causal: bool = True):
        """A FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` adding this bias; query index q_idx sits
        at position ``q_idx + k_len - q_len`` (bottom-right, as :meth:`bias`); with ``causal`` later keys get
        -inf. A table bias looks its values up in :meth:`distance_table`; tile biases override this."""
        q_len, k_len = check_lengths(q_len, k_len)
        shift, centre = k_len - q_len, k_len - 1
        tab = self.distance_table(k_len, causal=False)

        def table_score_mod(score, b, h, q_idx, kv_idx):
            d = q_idx + shift - kv_idx
            biased = score + tab[h, d + centre]
            if causal:
                biased = torch.where(d >= 0, biased, -math.inf)
            return biased

        return table_score_mod

    def blocked_attention(self, q, k, v, causal: bool, scale: float) -> torch.Tensor:
        """Attention with this bias on the CPU in O(L) memory per head (no (heads, L, L) tensor), the path
        :func:`posenc.attention` takes above ``materialise_max`` entries: q (batch, heads, q_len, dim), k
        (batch, kv_heads, k_len, dim), v (batch, kv_heads, k_len, v_dim) -> (batch, heads, q_len, v_dim).
        Here :mod:`posenc.kernels.bias_blocked`, one kernel for every table and tile bias; a bias with a
        faster kernel of its own overrides this."""
        from ..kernels.bias_blocked import bias_attention_blocked

        return bias_attention_blocked(q, k, v, self, causal=causal, scale=scale)

    def walker_inputs(self, k_len: int, causal: bool, device) -> tuple[torch.Tensor, ...]:
        """The tensors the blocked kernel differentiates for this bias: a table bias's (n_heads, 2 k_len - 1)
        :meth:`distance_table`, a tile bias's parameters that require grad."""
        if self.per_tile:
            return tuple(p for p in self.parameters() if p.requires_grad)
        return (self.distance_table(k_len, causal, device=device),)

    def block_walker(self, inputs, k_len: int, causal: bool, work: torch.dtype):
        """The blocked kernel's :class:`~posenc.kernels.block_walkers.BlockWalker` for one call over
        ``inputs`` (:meth:`walker_inputs`), in the kernel's ``work`` dtype: a table bias's blocks as views of
        its distance table, a tile bias's computed by :meth:`tile` (gradients by autograd against dS)."""
        from ..kernels.block_walkers import TableWalker, TileWalker

        if self.per_tile:
            device = inputs[0].device if inputs else self._device()
            return TileWalker(self, inputs, k_len, causal, work, device)
        return TableWalker(inputs[0].detach().to(work), k_len)

    def mask_mod(self, q_len: int, k_len: int | None = None):
        """A FlexAttention ``mask_mod``: bottom-right causal masking, True where a key is visible."""
        q_len, k_len = check_lengths(q_len, k_len)
        shift = k_len - q_len

        def causal_mask_mod(b, h, q_idx, kv_idx):
            return q_idx + shift >= kv_idx

        return causal_mask_mod
