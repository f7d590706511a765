"""The Triton RoPE kernel, run by Triton's interpreter on CPU tensors (CI has no GPU).

``TRITON_INTERPRET=1`` must be set before triton is imported, and it changes how posenc dispatches, so the
checks run in a child process; each check compares against posenc.reference or the eager module.
"""

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    r'''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import numpy as np
    import torch
    from posenc import RotaryEmbedding, reference
    from posenc.kernels import RotaryFunction
    from posenc.kernels.rotary_triton import RotaryTritonFunction, rotary_qk_triton
    from posenc.rotary import rotate_eager

    torch.manual_seed(0)
    failures = []

    def check(name, got, want, tol):
        err = float(np.abs(np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64)).max())
        if not err <= tol:
            failures.append(f"{name}: max error {err:.3g} > {tol:g}")

    def table(n, r, dtype=torch.float32):
        theta = torch.arange(n, dtype=torch.float64)[:, None] * (1.0 / 10000 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
        return theta.cos().to(dtype), theta.sin().to(dtype)

    B, HQ, HK, L, D = 2, 2, 1, 6, 8
    for interleaved in (True, False):
        layout = "interleaved" if interleaved else "half"
        for r in (8, 6):
            cos, sin = table(64, r)
            q, k = torch.randn(B, HQ, L, D), torch.randn(B, HK, L, D)
            # GQA in one launch, int offset, partial rotary; both against the numpy reference.
            qo, ko = rotary_qk_triton(q, k, cos, sin, interleaved=interleaved, seqlen_offsets=5)
            pos = np.arange(5, 5 + L)
            check(f"{layout} r={r} q", qo, reference.rope(q.numpy(), pos, layout=layout, rotary_dim=r), 1e-5)
            check(f"{layout} r={r} k", ko, reference.rope(k.numpy(), pos, layout=layout, rotary_dim=r), 1e-5)
            # Per-sequence offsets (decoding with a KV cache).
            offs = torch.tensor([3, 20])
            qo, ko = rotary_qk_triton(q, k, cos, sin, interleaved=interleaved, seqlen_offsets=offs)
            for b in range(B):
                p = np.arange(int(offs[b]), int(offs[b]) + L)
                check(f"{layout} r={r} offsets b={b}", qo[b], reference.rope(q[b].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
                check(f"{layout} r={r} offsets k b={b}", ko[b], reference.rope(k[b].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
            # Packed variable-length sequences: (heads, total, head_dim) with cu_seqlens; each restarts at position 0.
            lens = [3, 7, 1]
            cu = torch.tensor([0, 3, 10, 11], dtype=torch.int32)
            qp, kp = torch.randn(HQ, 11, D), torch.randn(HK, 11, D)
            qo, ko = rotary_qk_triton(qp, kp, cos, sin, interleaved=interleaved, cu_seqlens=cu, max_seqlen=7)
            for s in range(3):
                a, b_ = int(cu[s]), int(cu[s + 1])
                p = np.arange(lens[s])
                check(f"{layout} r={r} varlen q seq {s}", qo[:, a:b_], reference.rope(qp[:, a:b_].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
                check(f"{layout} r={r} varlen k seq {s}", ko[:, a:b_], reference.rope(kp[:, a:b_].numpy(), p, layout=layout, rotary_dim=r), 1e-5)
            # (total, heads, head_dim) packing is the same kernel on a transposed view.
            qt = qp.transpose(0, 1).contiguous()
            qo_t, _ = rotary_qk_triton(qt.transpose(0, 1), None, cos, sin, interleaved=interleaved, cu_seqlens=cu)
            check(f"{layout} r={r} varlen (total, heads, d)", qo_t, qo, 0.0)
            # In place, and bfloat16 (float32 arithmetic, one rounding).
            q2 = q.clone()
            rotary_qk_triton(q2, None, cos, sin, interleaved=interleaved, inplace=True)
            check(f"{layout} r={r} inplace", q2, reference.rope(q.numpy(), np.arange(L), layout=layout, rotary_dim=r), 1e-5)
            qb = q.to(torch.bfloat16)
            qo, _ = rotary_qk_triton(qb, None, cos, sin, interleaved=interleaved)
            # one bfloat16 rounding of values below 8: within 2^-5 (one unit in the last place) of the eager result
            check(f"{layout} r={r} bfloat16", qo.float(), rotate_eager(qb, cos[:L], sin[:L], layout).float(), 2**-5)
            # Batched table (batch, table_len, r/2), as for batched positions.
            cb, sb = torch.stack((cos, cos.flip(0))), torch.stack((sin, sin.flip(0)))
            qo, _ = rotary_qk_triton(q, None, cb, sb, interleaved=interleaved)
            for b in range(B):
                check(f"{layout} r={r} batched table b={b}", qo[b], rotate_eager(q[b], cb[b, :L], sb[b, :L], layout), 1e-6)

        # Backward: the same kernel with sin negated, through the autograd Function, in float64.
        cos64, sin64 = table(16, 6, torch.float64)
        q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
        offs = torch.tensor([2])
        if not torch.autograd.gradcheck(lambda a, b: RotaryTritonFunction.apply(a, b, cos64, sin64, interleaved, offs, None, None), (q, k)):
            failures.append(f"{layout} gradcheck")
        cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        qp = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
        if not torch.autograd.gradcheck(lambda a: RotaryTritonFunction.apply(a, None, cos64, sin64, interleaved, 0, cu, 3)[0], (qp,)):
            failures.append(f"{layout} varlen gradcheck")

        # The module dispatches to Triton (the interpreter counts as available) and matches the eager math,
        # gradients included.
        rope = RotaryEmbedding(8, rotary_dim=6, layout=layout)
        q = torch.randn(2, 2, 5, 8, requires_grad=True)
        k = torch.randn(2, 1, 5, 8, requires_grad=True)
        positions = torch.tensor([[float(i) for i in range(5)], [float(2 * i) for i in range(5)]])
        qo, ko = rope(q, k, positions=positions)
        cos_p, sin_p = rope._cos_sin_for(q, positions, 0)
        check(f"{layout} module q", qo.detach(), rotate_eager(q, cos_p, sin_p, layout).detach(), 1e-6)
        gq, gk = torch.autograd.grad((qo.sum(), (2 * ko).sum()), (q, k))
        qe, ke = rotate_eager(q, cos_p, sin_p, layout), rotate_eager(k, cos_p, sin_p, layout)
        wq, wk = torch.autograd.grad((qe.sum(), (2 * ke).sum()), (q, k))
        check(f"{layout} module grad q", gq, wq, 1e-6)
        check(f"{layout} module grad k", gk, wk, 1e-6)

    import posenc.kernels as kernels
    called = []
    import posenc.kernels.rotary_triton as rt
    orig = rt.rotary_qk_triton
    rt.rotary_qk_triton = lambda *a, **kw: (called.append(1), orig(*a, **kw))[1]
    RotaryEmbedding(8)(torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8))
    if len(called) != 1:
        failures.append(f"q and k of different head counts took {len(called)} launches, expected 1")

    print("\n".join(failures) if failures else "ALL OK")
    raise SystemExit(1 if failures else 0)
    '''
)


def test_triton_kernel_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "ALL OK" in proc.stdout
