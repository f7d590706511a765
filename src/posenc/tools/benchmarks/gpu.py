"""CUDA benchmark of the Triton RoPE kernel and FlexAttention ALiBi (run by ``benchmarks/gpu_check.sh``).

Reports, per shape and dtype: the kernel's time for q and k (forward, and forward + backward through
autograd), its bandwidth in GB/s (2 x (q.nbytes + k.nbytes) per rotation), the fraction of this device's
measured copy bandwidth (``dst.copy_(src)`` of the same bytes) and of the nominal HBM peak, and the speed-up
over transformers' eager ``apply_rotary_pos_emb``. Then ALiBi attention with FlexAttention against SDPA
with a materialised bias and causal SDPA: time and ``torch.cuda.max_memory_allocated`` rise.

``--device cpu --quick`` under ``TRITON_INTERPRET=1`` runs the same code on tiny shapes (a smoke test of
this script on a machine without a GPU; the timings then mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

# Nominal HBM bandwidth (GB/s) by device-name fragment, for the "fraction of peak" column.
NOMINAL_HBM_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L40": 864.0, "A10": 600.0, "4090": 1008.0}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, repeat: int) -> float:
    """Median seconds per call (synchronised), after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def nominal_peak(device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in NOMINAL_HBM_GBS.items() if k in name), None)


def bench_rope(device, shapes, dtypes, repeat: int) -> list[dict]:
    from ...kernels import apply_rotary_qk
    from ...rope import RotaryEmbedding

    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf
    except Exception:
        hf = None
    peak = nominal_peak(device)
    rows = []
    for shape in shapes:
        b, h, seq, d = shape
        for dtype in dtypes:
            q = torch.randn(shape, device=device, dtype=dtype)
            k = torch.randn((b, max(1, h // 4), seq, d), device=device, dtype=dtype)  # GQA: 4 query heads per kv head
            dq, dk = torch.empty_like(q), torch.empty_like(k)
            nbytes = 2 * (q.nbytes + k.nbytes)
            t_copy = _time(lambda q=q, k=k, dq=dq, dk=dk: (dq.copy_(q), dk.copy_(k)), device, repeat)
            for layout in ("half", "interleaved"):
                rope = RotaryEmbedding(d, layout=layout).to(device)
                cos, sin = rope.cos_sin(seq, device=device)
                args = (q, k, cos, sin)
                with torch.no_grad():
                    t_out = _time(lambda a=args, lay=layout: apply_rotary_qk(*a, layout=lay), device, repeat)
                    t_in = _time(lambda a=args, lay=layout: apply_rotary_qk(*a, layout=lay, inplace=True), device, repeat)
                grad_args = (q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_(), cos, sin)

                def fwd_bwd(a=grad_args, lay=layout):
                    qo, ko = apply_rotary_qk(*a, layout=lay)
                    torch.autograd.backward((qo, ko), (qo, ko))

                t_fb = _time(fwd_bwd, device, repeat)
                t_hf = None
                if hf is not None:
                    cf = torch.cat((cos, cos), -1).to(dtype)[None]
                    sf = torch.cat((sin, sin), -1).to(dtype)[None]
                    t_hf = _time(lambda a=(q, k, cf, sf): hf(*a), device, repeat)
                for mode, sec in (("out", t_out), ("inplace", t_in)):
                    rows.append({
                        "shape": list(shape), "k_heads": k.shape[1], "dtype": str(dtype).removeprefix("torch."),
                        "layout": layout, "mode": mode, "ms": sec * 1e3, "gb_per_s": nbytes / sec / 1e9,
                        "fraction_of_copy": t_copy / sec,
                        "fraction_of_nominal_hbm": (nbytes / sec / 1e9) / peak if peak else None,
                        "fwd_bwd_ms": t_fb * 1e3, "speedup_vs_hf": (t_hf / sec) if t_hf else None,
                    })
    return rows


def bench_alibi(device, lengths, heads: int, dim: int, repeat: int) -> list[dict]:
    import torch.nn.functional as F

    from ... import ALiBi, attention
    from ...attention import alibi_backend

    alibi = ALiBi(heads).to(device)
    rows = []
    for seq in lengths:
        q, k, v = (torch.randn(1, heads, seq, dim, device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
                   for _ in range(3))
        qkv = (q, k, v)
        cases = {
            "posenc": lambda a=qkv: attention(*a, bias=alibi, causal=True),
            "sdpa causal": lambda a=qkv: F.scaled_dot_product_attention(*a, is_causal=True),
        }
        if 3 * heads * seq * seq * q.element_size() < 0.5 * (torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 << 30):
            cases["sdpa+bias"] = lambda a=qkv, n=seq: F.scaled_dot_product_attention(
                *a, attn_mask=alibi.bias(n, n, causal=True).to(a[0].dtype))
        ref = cases.get("sdpa+bias")
        if ref is not None and seq <= 4096:
            with torch.no_grad():
                err = (cases["posenc"]().float() - ref().float()).abs().max().item()
        else:
            err = None
        for name, fn in cases.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            with torch.no_grad():
                sec = _time(fn, device, repeat)
            peak = (torch.cuda.max_memory_allocated(device) - base) if device.type == "cuda" else None
            rows.append({"seq": seq, "case": name, "seconds": sec, "peak_bytes": peak,
                         "backend": alibi_backend(q, k) if name == "posenc" else None,
                         "max_abs_err_vs_materialised": err if name == "posenc" else None})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.quick:
        shapes, lengths, dtypes, repeat = [(1, 4, 16, 32)], [128], [torch.float32], 2
    else:
        shapes = [(4, 16, 2048, 128), (1, 32, 8192, 128), (8, 32, 4096, 128)]
        lengths, dtypes, repeat = [2048, 8192, 16384, 65536], [torch.float32, torch.bfloat16], args.repeat
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
              "nominal_hbm_gb_per_s": nominal_peak(device), "torch": torch.__version__}
    result["rope"] = bench_rope(device, shapes, dtypes, repeat)
    for r in result["rope"]:
        frac = f"{r['fraction_of_nominal_hbm']:.0%}" if r["fraction_of_nominal_hbm"] else "n/a"
        hf = f"{r['speedup_vs_hf']:.1f}x" if r["speedup_vs_hf"] else "n/a"
        print(f"rope {tuple(r['shape'])} k_heads={r['k_heads']} {r['dtype']:<9} {r['layout']:<11} {r['mode']:<7} "
              f"{r['ms']:8.3f} ms {r['gb_per_s']:8.0f} GB/s copy {r['fraction_of_copy']:.0%} HBM {frac} "
              f"fwd+bwd {r['fwd_bwd_ms']:.3f} ms vs HF {hf}", flush=True)
    result["alibi"] = bench_alibi(device, lengths, 8, 64, max(1, repeat // 4))
    for r in result["alibi"]:
        peak = f"{r['peak_bytes'] / 2**20:.0f} MiB" if r["peak_bytes"] is not None else "n/a"
        err = r["max_abs_err_vs_materialised"]
        print(f"alibi L={r['seq']:<6} {r['case']:<12} {r['seconds'] * 1e3:9.2f} ms peak {peak}"
              + (f" backend={r['backend']}" if r["backend"] else "") + (f" err={err:.2e}" if err is not None else ""),
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return 0 if all(math.isfinite(r["ms"]) for r in result["rope"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
