"""Triton RoPE kernel for CUDA (runs on CPU tensors under ``TRITON_INTERPRET=1``, which is how CI tests it).

RoPE (Su et al. 2021, arxiv.org/abs/2104.09864) rotates pair k of a query or key at position p by
theta = p * omega_k. One launch rotates q and k together, even when they have different head counts
(grouped-query attention): grid axis 1 runs over q's heads, then k's. The backward pass is the same
kernel with sin negated (a rotation's transpose is its inverse), as in flash-attention's
``ops/triton/rotary.py``.

Layouts handled by strides, so any view works: q (batch, heads, seq, head_dim), or packed variable-length
sequences (heads, total_tokens, head_dim) with ``cu_seqlens`` (batch + 1,) int32 boundaries; a
(total_tokens, heads, head_dim) tensor is passed as its ``.transpose(0, 1)`` view. Token m of sequence b
is at position ``m + seqlen_offsets[b]`` (an int, or a (batch,) tensor for per-sequence offsets, as in
decoding with a KV cache) and looks up row ``position`` of the cos/sin table: (table_len, rotary_dim/2)
shared by the batch, or (batch, table_len, rotary_dim/2).

Arithmetic is float32 (float64 for a float64 table); the result is cast to x's dtype once, at the store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rotary_function import RotaryFunction


# fmt: off  (Triton kernels: the argument lists read best grouped by role)
@triton.jit
def _rotate_tile(
    X,
    OUT,
    COS,
    SIN,
    CU_SEQLENS,
    SEQ_OFFSETS,
    pid_m,
    pid_b,
    head,
    seqlen,
    offset,
    table_len,
    sxb,
    sxh,
    sxm,
    sob,
    soh,
    som,
    scb,
    scm,
    R_HALF: tl.constexpr,
    D_REST: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    OFFSETS_TENSOR: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    CONJ: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Rotate rows [pid_m * BLOCK_M, +BLOCK_M) of one head of one sequence."""
    if IS_VARLEN:
        start = tl.load(CU_SEQLENS + pid_b).to(tl.int64)
        seqlen = (tl.load(CU_SEQLENS + pid_b + 1).to(tl.int64) - start).to(tl.int32)
        x_base = X + start * sxm + head * sxh
        o_base = OUT + start * som + head * soh
    else:
        x_base = X + pid_b.to(tl.int64) * sxb + head * sxh
        o_base = OUT + pid_b.to(tl.int64) * sob + head * soh
    if OFFSETS_TENSOR:
        offset = tl.load(SEQ_OFFSETS + pid_b)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_H)
    row_ok = rm < seqlen
    pos = rm + offset
    mask = row_ok[:, None] & (rk < R_HALF)[None, :]
    # Positions past the table read cos=1, sin=0 (identity); the wrapper sizes the table so none are.
    tmask = mask & (pos < table_len)[:, None]
    tab = pid_b.to(tl.int64) * scb + pos.to(tl.int64)[:, None] * scm + rk[None, :]
    c = tl.load(COS + tab, mask=tmask, other=1.0)
    s = tl.load(SIN + tab, mask=tmask, other=0.0)
    if CONJ:
        s = -s
    if INTERLEAVED:  # pairs (2i, 2i+1): Su et al. 2021, Meta's Llama, GPT-J
        i1 = 2 * rk
        i2 = 2 * rk + 1
    else:  # pairs (i, i + r/2): GPT-NeoX, Hugging Face Llama
        i1 = rk
        i2 = rk + R_HALF
    x_rows = x_base + rm.to(tl.int64)[:, None] * sxm
    o_rows = o_base + rm.to(tl.int64)[:, None] * som
    x1 = tl.load(x_rows + i1[None, :], mask=mask, other=0.0).to(c.dtype)
    x2 = tl.load(x_rows + i2[None, :], mask=mask, other=0.0).to(c.dtype)
    o1 = x1 * c - x2 * s
    o2 = x1 * s + x2 * c
    tl.store(o_rows + i1[None, :], o1.to(OUT.dtype.element_ty), mask=mask)
    tl.store(o_rows + i2[None, :], o2.to(OUT.dtype.element_ty), mask=mask)
    if D_REST > 0:  # out of place with partial rotary: carry the unrotated tail over
        rp = tl.arange(0, BLOCK_P)
        pmask = row_ok[:, None] & (rp < D_REST)[None, :]
        tail = tl.load(x_rows + 2 * R_HALF + rp[None, :], mask=pmask)
        tl.store(o_rows + 2 * R_HALF + rp[None, :], tail, mask=pmask)


@triton.jit
def _rope_qk_kernel(
    Q,
    K,
    QO,
    KO,
    COS,
    SIN,
    CU_SEQLENS,
    SEQ_OFFSETS,
    seqlen,
    offset,
    table_len,
    n_heads_q,
    sqb,
    sqh,
    sqm,
    sqob,
    sqoh,
    sqom,
    skb,
    skh,
    skm,
    skob,
    skoh,
    skom,
    scb,
    scm,
    R_HALF: tl.constexpr,
    D_REST: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    OFFSETS_TENSOR: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    CONJ: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)  # 0 .. n_heads_q-1: q's heads; then k's
    pid_b = tl.program_id(2)
    if pid_h < n_heads_q:
        _rotate_tile(
            Q,
            QO,
            COS,
            SIN,
            CU_SEQLENS,
            SEQ_OFFSETS,
            pid_m,
            pid_b,
            pid_h,
            seqlen,
            offset,
            table_len,
            sqb,
            sqh,
            sqm,
            sqob,
            sqoh,
            sqom,
            scb,
            scm,
            R_HALF,
            D_REST,
            IS_VARLEN,
            OFFSETS_TENSOR,
            INTERLEAVED,
            CONJ,
            BLOCK_M,
            BLOCK_H,
            BLOCK_P,
        )
    else:
        _rotate_tile(
            K,
            KO,
            COS,
            SIN,
            CU_SEQLENS,
            SEQ_OFFSETS,
            pid_m,
            pid_b,
            pid_h - n_heads_q,
            seqlen,
            offset,
            table_len,
            skb,
            skh,
            skm,
            skob,
            skoh,
            skom,
            scb,
            scm,
            R_HALF,
            D_REST,
            IS_VARLEN,
            OFFSETS_TENSOR,
            INTERLEAVED,
            CONJ,
            BLOCK_M,
            BLOCK_H,
            BLOCK_P,
        )


# fmt: on


def _strides(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, seq) strides of a 4-D x, or (0, head, token) of a packed 3-D x."""
    if varlen:
        return 0, x.stride(0), x.stride(1)
    return x.stride(0), x.stride(1), x.stride(2)


def _check_arguments(q, k, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen) -> tuple[int, int]:
    """Shapes and strides :func:`rotary_qk_triton` needs; returns (batch, longest sequence)."""
    varlen = cu_seqlens is not None
    want = 3 if varlen else 4
    tensors = [("q", q)] + ([("k", k)] if k is not None else [])
    for name, x in tensors:
        if x.dim() != want:
            layout = (
                "(heads, total_tokens, head_dim) with cu_seqlens"
                if varlen
                else "(batch, heads, seq, head_dim)"
            )
            raise ValueError(f"{name} must have shape {layout}, got {tuple(x.shape)}")
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension, got strides {x.stride()}")
    if k is not None and (
        k.dtype != q.dtype
        or k.shape[-1] != q.shape[-1]
        or k.shape[-2] != q.shape[-2]
        or (not varlen and k.shape[0] != q.shape[0])
    ):
        raise ValueError(
            f"k must match q's dtype, batch, length and head_dim; got q {tuple(q.shape)} {q.dtype}, "
            f"k {tuple(k.shape)} {k.dtype}"
        )
    head_dim, r_half = q.shape[-1], cos.shape[-1]
    if 2 * r_half > head_dim or sin.shape != cos.shape:
        raise ValueError(
            "cos and sin must have matching shapes (..., rotary_dim/2) with "
            f"rotary_dim <= head_dim={head_dim}, "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if varlen:
        batch = cu_seqlens.numel() - 1
        seqlen = int(max_seqlen) if max_seqlen is not None else int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    else:
        batch, seqlen = q.shape[0], q.shape[2]
    if cos.dim() == 3 and cos.shape[0] != batch:
        raise ValueError(f"a batched cos/sin table must have batch size {batch}, got {tuple(cos.shape)}")
    if isinstance(seqlen_offsets, torch.Tensor) and seqlen_offsets.shape != (batch,):
        raise ValueError(
            f"seqlen_offsets must be an int or a ({batch},) tensor, got shape {tuple(seqlen_offsets.shape)}"
        )
    return batch, seqlen


def rotary_qk_triton(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = True,
    conjugate: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k (k may be None) in one launch. No autograd: see :func:`apply_rotary_triton`.

    Args:
        q: (batch, heads_q, seq, head_dim), or with ``cu_seqlens`` (heads_q, total_tokens, head_dim);
            the last dimension must be contiguous.
        k: the same with heads_k heads (heads_k may differ from heads_q), same dtype and sequence layout;
            or None.
        cos, sin: (table_len, rotary_dim/2) or (batch, table_len, rotary_dim/2); float32 (float64 for
            float64 x).
        interleaved: pairs (2i, 2i+1) if True, (i, i + rotary_dim/2) if False.
        conjugate: rotate by -theta (backward).
        inplace: write into q and k.
        seqlen_offsets: int, or (batch,) integer tensor: position of each sequence's first token.
        cu_seqlens: (batch + 1,) int32 cumulative sequence lengths of packed sequences.
        max_seqlen: longest packed sequence (default: computed from cu_seqlens, which syncs).

    Returns:
        (q_out, k_out), the inputs themselves when ``inplace``.
    """
    varlen = cu_seqlens is not None
    batch, seqlen = _check_arguments(q, k, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen)
    head_dim = q.shape[-1]
    r_half = cos.shape[-1]
    cos, sin = cos.contiguous(), sin.contiguous()
    scb = cos.stride(0) if cos.dim() == 3 else 0
    offsets_tensor = isinstance(seqlen_offsets, torch.Tensor)
    offs = seqlen_offsets.to(torch.int32).contiguous() if offsets_tensor else cos  # dummy pointer when unused
    offset = 0 if offsets_tensor else int(seqlen_offsets)

    qo = q if inplace else torch.empty_like(q)
    ko = None if k is None else (k if inplace else torch.empty_like(k))
    heads_q = q.shape[0] if varlen else q.shape[1]
    heads_k = 0 if k is None else (k.shape[0] if varlen else k.shape[1])
    kk, kko = (k, ko) if k is not None else (q, qo)  # unused pointers when heads_k == 0
    d_rest = 0 if inplace else head_dim - 2 * r_half
    block_h = max(triton.next_power_of_2(r_half), 2)
    # ~2048 elements per program (e.g. 32 rows x 64 pairs): enough bytes in flight per SM to stream HBM.
    # Untuned on hardware so far: benchmarks/gpu_check.sh reports the resulting share of HBM bandwidth.
    block_m = max(4, min(64, 2048 // block_h))
    grid = (triton.cdiv(max(seqlen, 1), block_m), heads_q + heads_k, batch)
    # fmt: off
    _rope_qk_kernel[grid](
        q, kk, qo, kko, cos, sin, cu_seqlens if varlen else cos, offs,
        seqlen, offset, cos.shape[-2], heads_q,
        *_strides(q, varlen), *_strides(qo, varlen),
        *_strides(kk, varlen), *_strides(kko, varlen),
        scb, cos.stride(-2),
        R_HALF=r_half, D_REST=d_rest,
        IS_VARLEN=varlen, OFFSETS_TENSOR=offsets_tensor,
        INTERLEAVED=bool(interleaved), CONJ=bool(conjugate),
        BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_P=max(triton.next_power_of_2(max(d_rest, 1)), 2),
    )
    # fmt: on
    return qo, ko


def apply_rotary_triton(q, k, cos, sin, **kernel_args) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`rotary_qk_triton` with autograd (backward: the same kernel, sin negated). Same arguments,
    except ``conjugate`` and ``inplace``."""

    def rotate(xs, conjugate=False):
        if conjugate and torch.is_grad_enabled():
            raise NotImplementedError(
                "double backward (create_graph=True) through apply_rotary_triton's packed sequences is not "
                "supported; rotate padded (batch, heads, seq, head_dim) tensors with "
                "posenc.kernels.apply_rotary_qk"
            )
        if conjugate:  # gradients may arrive as expanded views; the kernel needs a unit last stride
            xs = tuple(x.contiguous() for x in xs)
        qo, ko = rotary_qk_triton(
            xs[0], xs[1] if len(xs) > 1 else None, cos, sin, conjugate=conjugate, **kernel_args
        )
        return (qo,) if len(xs) == 1 else (qo, ko)

    out = RotaryFunction.apply(rotate, q) if k is None else RotaryFunction.apply(rotate, q, k)
    return (out[0], None) if k is None else tuple(out)
