"""Correctness checks of the Triton RoPE kernel, runnable on a GPU or under Triton's CPU interpreter.

``run_checks("cuda")`` on a machine with a GPU (``benchmarks/gpu_check.sh``), ``run_checks("cpu")`` in a
process started with ``TRITON_INTERPRET=1`` (``tests/test_rotary_triton.py``). Inputs are made on the CPU
from a fixed seed, moved to the device, and every result is compared on the CPU with
:func:`posenc.reference.rope` or the eager module; gradients with ``torch.autograd.gradcheck`` in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from ... import RotaryEmbedding, reference
from ...rope.embedding import rotate_eager


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _table(n: int, r: int, dtype=torch.float32):
    theta = torch.arange(n, dtype=torch.float64)[:, None] * (1.0 / 10000 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    return theta.cos().to(dtype), theta.sin().to(dtype)


def run_checks(device: str = "cpu") -> list[str]:
    """Run every check with tensors on ``device``; returns the failures (empty when all pass)."""
    from ...kernels.rotary_triton import RotaryTritonFunction, rotary_qk_triton

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    failures: list[str] = []

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    def check(name, got, want, tol):
        err = float(np.abs(_np(got) - _np(want)).max())
        if not err <= tol:
            failures.append(f"{name}: max error {err:.3g} > {tol:g}")

    def on(*ts):
        return [t.to(dev) if isinstance(t, torch.Tensor) else t for t in ts]

    B, HQ, HK, L, D = 2, 2, 1, 6, 8
    for interleaved in (True, False):
        layout = "interleaved" if interleaved else "half"
        for r in (8, 6):  # full and partial rotary
            cos, sin = _table(64, r)
            q, k = randn(B, HQ, L, D), randn(B, HK, L, D)
            cd, sd = on(cos, sin)
            # q and k with different head counts in one launch, an int offset.
            qo, ko = rotary_qk_triton(*on(q, k), cd, sd, interleaved=interleaved, seqlen_offsets=5)
            pos = np.arange(5, 5 + L)
            check(f"{layout} r={r} q", qo, reference.rope(q.numpy(), pos, layout=layout, rotary_dim=r), 1e-5)
            check(f"{layout} r={r} k", ko, reference.rope(k.numpy(), pos, layout=layout, rotary_dim=r), 1e-5)
            # Per-sequence offsets (decoding with a KV cache).
            offs = torch.tensor([3, 20])
            qo, ko = rotary_qk_triton(*on(q, k), cd, sd, interleaved=interleaved, seqlen_offsets=offs.to(dev))
            for b in range(B):
                p = np.arange(int(offs[b]), int(offs[b]) + L)
                check(f"{layout} r={r} offsets q b={b}", qo[b], reference.rope(q[b].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
                check(f"{layout} r={r} offsets k b={b}", ko[b], reference.rope(k[b].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
            # Packed variable-length sequences (heads, total, head_dim): each restarts at position 0.
            cu = torch.tensor([0, 3, 10, 11], dtype=torch.int32)
            qp, kp = randn(HQ, 11, D), randn(HK, 11, D)
            qo, ko = rotary_qk_triton(*on(qp, kp), cd, sd, interleaved=interleaved, cu_seqlens=cu.to(dev), max_seqlen=7)
            for s in range(3):
                a, e = int(cu[s]), int(cu[s + 1])
                p = np.arange(e - a)
                check(f"{layout} r={r} varlen q seq {s}", qo[:, a:e], reference.rope(qp[:, a:e].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
                check(f"{layout} r={r} varlen k seq {s}", ko[:, a:e], reference.rope(kp[:, a:e].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
            # (total, heads, head_dim) packing is the same kernel on a transposed view.
            (qt,) = on(qp.transpose(0, 1).contiguous())
            qo_t, _ = rotary_qk_triton(qt.transpose(0, 1), None, cd, sd, interleaved=interleaved, cu_seqlens=cu.to(dev))
            check(f"{layout} r={r} varlen (total, heads, d)", qo_t, qo, 0.0)
            # In place.
            (q2,) = on(q.clone())
            rotary_qk_triton(q2, None, cd, sd, interleaved=interleaved, inplace=True)
            check(f"{layout} r={r} inplace", q2, reference.rope(q.numpy(), np.arange(L), layout=layout, rotary_dim=r), 1e-5)
            # bfloat16: float32 arithmetic, one rounding; values below 8 are within 2^-5 (one ulp) of the eager result.
            qb = q.to(torch.bfloat16)
            qo, _ = rotary_qk_triton(*on(qb), None, cd, sd, interleaved=interleaved)
            check(f"{layout} r={r} bfloat16", qo, rotate_eager(qb, cos[:L], sin[:L], layout), 2**-5)
            # A batched table (batch, table_len, r/2), as batched positions give.
            cb, sb = torch.stack((cos, cos.flip(0))), torch.stack((sin, sin.flip(0)))
            qo, _ = rotary_qk_triton(*on(q), None, *on(cb, sb), interleaved=interleaved)
            for b in range(B):
                check(f"{layout} r={r} batched table b={b}", qo[b], rotate_eager(q[b], cb[b, :L], sb[b, :L], layout), 1e-6)

        # Backward = the same kernel with sin negated, through the autograd Function, in float64.
        cos64, sin64 = on(*_table(16, 6, torch.float64))
        q = randn(1, 2, 3, 8, dtype=torch.float64).to(dev).requires_grad_()
        k = randn(1, 1, 3, 8, dtype=torch.float64).to(dev).requires_grad_()
        offs = torch.tensor([2], device=dev)
        def fn(a, b, c=cos64, s=sin64, il=interleaved, o=offs):
            return RotaryTritonFunction.apply(a, b, c, s, il, o, None, None)

        if not torch.autograd.gradcheck(fn, (q, k)):
            failures.append(f"{layout} gradcheck")
        cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=dev)
        qp = randn(1, 5, 8, dtype=torch.float64).to(dev).requires_grad_()
        def fn_varlen(a, c=cos64, s=sin64, il=interleaved, cu=cu):
            return RotaryTritonFunction.apply(a, None, c, s, il, 0, cu, 3)[0]

        if not torch.autograd.gradcheck(fn_varlen, (qp,)):
            failures.append(f"{layout} varlen gradcheck")

        # The module dispatches to Triton for these tensors and matches the eager math, gradients included.
        rope = RotaryEmbedding(8, rotary_dim=6, layout=layout).to(dev)
        q = randn(2, 2, 5, 8).to(dev).requires_grad_()
        k = randn(2, 1, 5, 8).to(dev).requires_grad_()
        positions = torch.tensor([[float(i) for i in range(5)], [float(2 * i) for i in range(5)]], device=dev)
        qo, ko = rope(q, k, positions=positions)
        cos_p, sin_p = rope._cos_sin_for(q, positions, 0)
        check(f"{layout} module q", qo, rotate_eager(q, cos_p, sin_p, layout), 1e-6)
        gq, gk = torch.autograd.grad((qo.sum(), (2 * ko).sum()), (q, k))
        qe, ke = rotate_eager(q, cos_p, sin_p, layout), rotate_eager(k, cos_p, sin_p, layout)
        wq, wk = torch.autograd.grad((qe.sum(), (2 * ke).sum()), (q, k))
        check(f"{layout} module grad q", gq, wq, 1e-6)
        check(f"{layout} module grad k", gk, wk, 1e-6)

    # q and k of different head counts go through one launch from the module.
    import posenc.kernels.rotary_triton as rt

    launches = []
    original = rt.rotary_qk_triton

    def counting(*args, **kwargs):
        launches.append(1)
        return original(*args, **kwargs)

    rt.rotary_qk_triton = counting
    try:
        RotaryEmbedding(8).to(dev)(randn(1, 2, 3, 8).to(dev), randn(1, 1, 3, 8).to(dev))
    finally:
        rt.rotary_qk_triton = original
    if len(launches) != 1:
        failures.append(f"q and k with different head counts took {len(launches)} launches, expected 1")
    return failures


if __name__ == "__main__":
    import sys

    found = run_checks(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    print("\n".join(found) if found else "ALL OK")
    sys.exit(1 if found else 0)
