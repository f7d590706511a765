"""FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating Optimized Attention
Kernels", arXiv:2412.05496) as posenc calls it: compiled once per process with dynamic shapes, so one graph
serves every length; eager (torch's reference implementation, forward only) on the CPU, where torch 2.13
compiles no backward."""

from __future__ import annotations

import torch

__all__ = ["flex_attention", "flex_with_lse"]

_compiled = None


def flex_attention():
    """``torch.nn.attention.flex_attention.flex_attention``: compiled (``dynamic=True``) for CUDA tensors;
    importing it pulls in torch's compiler stack, so it is imported on the first call, not with posenc."""
    global _compiled
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention as flex

        _compiled = torch.compile(flex, dynamic=True)
    return _compiled


def flex_with_lse(q, k, v, *, block_mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention of q (B, H, Lq, D) over k, v (B, Hk, Lk, D/Dv), Hk dividing H, under ``block_mask``:
    the output (B, H, Lq, Dv) and each row's log-sum-exp of its scaled scores (B, H, Lq), float32, natural
    log; a row with no key allowed gives output 0 and log-sum-exp -inf. Compiled on CUDA, eager elsewhere."""
    from torch.nn.attention import flex_attention as fa

    call = flex_attention() if q.is_cuda else fa.flex_attention
    if not q.is_cuda and not torch.is_grad_enabled():  # torch refuses CPU inputs that require grad at all
        q, k, v = q.detach(), k.detach(), v.detach()
    kwargs = dict(block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if hasattr(fa, "AuxRequest"):
        out, aux = call(q, k, v, return_aux=fa.AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    return call(q, k, v, return_lse=True, **kwargs)  # torch < 2.9
