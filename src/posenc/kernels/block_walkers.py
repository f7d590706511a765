"""The block-walker hook of the blocked score-bias kernel (:mod:`posenc.kernels.bias_blocked`).

The kernel walks queries in blocks: block (p0, n, kend) is the queries at positions p0 .. p0 + n - 1 against
the keys kend - 1, ..., 0, in *reverse* order (so that a function of i - j is a strided view). A score bias
hands the kernel one :class:`BlockWalker` per call, from
:meth:`~posenc.bias.base.ScoreBias.block_walker`; the walker gives each block's bias and turns each block's
score gradient dS into the gradients of the bias's inputs
(:meth:`~posenc.bias.base.ScoreBias.walker_inputs`: the tensors the kernel's autograd Function
differentiates). Two walkers serve every bias by default: :class:`TableWalker` (a function of i - j) and
:class:`TileWalker` (autograd of the bias's ``tile`` against dS); a bias with a faster walk of its own returns
its walker instead (FIRE's: :mod:`posenc.kernels.fire_walker`).
"""

from __future__ import annotations

import math

import torch

from .blocked_common import diagonal_sums

__all__ = ["BlockWalker", "TableWalker", "TileWalker"]


class BlockWalker:
    """What the blocked kernel asks of a bias, block by block.

    * ``mask(p0, n, kend)``: the block's (1, heads, n, kend) bias in the kernel's work dtype against the
      reversed keys, -inf where a causal mask hides a key;
    * ``new_grads()``: the accumulators of one backward (a list of tensors);
    * ``accumulate(grads, p0, n, kend, ds)``: add the block's share given its score gradient ds
      (heads, n, kend), summed over the batch; ds is zero at masked scores;
    * ``finish(grads)``: the gradients of the bias's inputs, in their order (here the accumulators as they
      are).
    """

    def mask(self, p0: int, n: int, kend: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement mask()")

    def new_grads(self) -> list:
        raise NotImplementedError(f"{type(self).__name__} must implement new_grads()")

    def accumulate(self, grads, p0: int, n: int, kend: int, ds: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement accumulate()")

    def finish(self, grads) -> list:
        return grads


class TableWalker(BlockWalker):
    """A table bias: the (heads, 2 lk - 1) distance table, blocks as strided views against reversed keys."""

    def __init__(self, tab: torch.Tensor, lk: int):
        self.tab, self.lk = tab.contiguous(), lk

    def mask(self, p0: int, n: int, kend: int) -> torch.Tensor:
        h, s = self.tab.shape[0], self.tab.stride(0)
        off = p0 - kend + self.lk
        return self.tab.as_strided((1, h, n, kend), (0, s, 1, 1), self.tab.storage_offset() + off)

    def new_grads(self):
        return [torch.zeros_like(self.tab)]

    def accumulate(self, grads, p0: int, n: int, kend: int, ds: torch.Tensor) -> None:
        """grads[0][:, off + t] += sum over a + j' = t of ds[:, a, j'] (ds: (heads, n, kend))."""
        off = p0 - kend + self.lk
        grads[0][:, off : off + kend + n - 1] += diagonal_sums(ds)


class TileWalker(BlockWalker):
    """A tile bias: each block's bias computed by ``bias.tile`` at reversed key positions, its parameters'
    gradients by autograd of the recomputed tile against dS."""

    def __init__(self, bias, params, lk: int, causal: bool, work: torch.dtype, device):
        self.bias, self.params, self.lk, self.causal, self.work = bias, params, lk, causal, work
        self.pos = torch.arange(lk, device=device)

    def _positions(self, p0: int, n: int, kend: int):
        return self.pos[p0 : p0 + n], self.pos[:kend].flip(0)

    def mask(self, p0: int, n: int, kend: int) -> torch.Tensor:
        i, j = self._positions(p0, n, kend)
        with torch.no_grad():
            t = self.bias.tile(i, j).to(self.work)
        if self.causal:
            t = t.masked_fill((j[None, :] > i[:, None])[None], -math.inf)
        return t[None]

    def new_grads(self):
        return [torch.zeros_like(p) for p in self.params]

    def accumulate(self, grads, p0: int, n: int, kend: int, ds: torch.Tensor) -> None:
        i, j = self._positions(p0, n, kend)
        with torch.enable_grad():
            t = self.bias.tile(i, j)
            got = torch.autograd.grad(t, self.params, ds.to(t.dtype), allow_unused=True)
        for g, d in zip(grads, got, strict=True):
            if d is not None:
                g += d
