"""The one autograd Function for every RoPE kernel.

A rotation is orthogonal, so its gradient is the same rotation by -theta (its transpose): the backward
pass calls the forward kernel again with ``conjugate=True`` and autograd never stores the products of
the eager formula. The kernel is passed in, so the CPU path, the Triton path and packed variable-length
Triton calls all share this one Function.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["RotaryFunction", "Rotate"]

Rotate = Callable[..., tuple[torch.Tensor, ...]]
"""``rotate(xs, conjugate=False) -> outputs``: rotates each tensor of the tuple xs by its angles."""


class RotaryFunction(torch.autograd.Function):
    """``RotaryFunction.apply(rotate, *xs)``: ``rotate(xs)`` forward, ``rotate(grads, conjugate=True)``
    backward."""

    @staticmethod
    def forward(ctx, rotate: Rotate, *xs):
        ctx.rotate = rotate
        ctx.metas = [(x.shape, x.dtype, x.device) for x in xs]
        ctx.set_materialize_grads(False)
        return rotate(xs)

    @staticmethod
    def backward(ctx, *grads):
        # An output that was not used has no gradient; rotating zeros gives zeros, so stand them in.
        grads = tuple(
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.metas, strict=True)
        )
        return (None, *ctx.rotate(grads, conjugate=True))
