"""``posenc bench``: RoPE throughput and long-context ALiBi attention, as a table and as JSON.

The code it runs lives in :mod:`posenc.tools.benchmarks`. Targets (2-core CPU, from issue 4) are checked and
reported, not asserted: RoPE on q and k out of place >= 4x transformers' eager ``apply_rotary_pos_emb``;
in place >= 60% of copy bandwidth; ALiBi attention at L = 16384 under 1.5 GB peak and within 3x of causal
SDPA without a bias.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

TARGET_HF_SPEEDUP = 4.0
TARGET_INPLACE_COPY_FRACTION = 0.60
TARGET_ALIBI_PEAK_BYTES = 1.5e9
TARGET_ALIBI_X_CAUSAL = 3.0
TARGET_ALIBI_SEQ = 16384


def targets(rope_rows: list[dict], attn_rows: list[dict]) -> list[dict]:
    """Each target with the measured value and whether it is met (worst case over the rows it covers)."""
    out = []
    for r in rope_rows:
        tag = f"{tuple(r['shape'])} {r['dtype']} {r['layout']}"
        if r["mode"] == "out" and r["speedup_vs_hf"] is not None:
            out.append({"target": f"RoPE out of place >= {TARGET_HF_SPEEDUP:g}x HF, {tag}",
                        "value": r["speedup_vs_hf"], "met": r["speedup_vs_hf"] >= TARGET_HF_SPEEDUP})
        if r["mode"] == "inplace":
            out.append({"target": f"RoPE in place >= {TARGET_INPLACE_COPY_FRACTION:.0%} of copy, {tag}",
                        "value": r["fraction_of_copy"], "met": r["fraction_of_copy"] >= TARGET_INPLACE_COPY_FRACTION})
    for r in attn_rows:
        if r["case"] != "posenc" or r["seq"] != TARGET_ALIBI_SEQ or "seconds" not in r:
            continue
        out.append({"target": f"ALiBi L={r['seq']} peak < {TARGET_ALIBI_PEAK_BYTES / 1e9:g} GB",
                    "value": r["peak_bytes"], "met": r["peak_bytes"] < TARGET_ALIBI_PEAK_BYTES})
        if "x_causal_sdpa" in r:
            out.append({"target": f"ALiBi L={r['seq']} time <= {TARGET_ALIBI_X_CAUSAL:g}x causal SDPA",
                        "value": r["x_causal_sdpa"], "met": r["x_causal_sdpa"] <= TARGET_ALIBI_X_CAUSAL})
    return out


def _targets_table(rows: list[dict]) -> str:
    lines = ["Targets"]
    for t in rows:
        v = t["value"]
        shown = f"{v / 2**20:.0f} MiB" if "peak" in t["target"] else f"{v:.2f}"
        lines.append(f"  [{'met' if t['met'] else 'NOT met'}] {t['target']}: {shown}")
    return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> int:
    import torch

    from .benchmarks import attention as attn_bench
    from .benchmarks import rope as rope_bench

    result = {
        "quick": bool(args.quick),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_average_before": os.getloadavg()},
        "rope": [], "attention": [],
    }
    # Other processes' load skews every timing here; say how busy the machine was.
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    if args.only in (None, "rope"):
        result["rope"] = rope_bench.run(quick=args.quick, repeat=args.repeat)
        print(rope_bench.table(result["rope"]), flush=True)
        print()
    if args.only in (None, "attention"):
        result["attention"] = attn_bench.run(quick=args.quick, repeat=args.repeat)
        print(attn_bench.table(result["attention"]), flush=True)
        print()
    # Targets are about the full shapes; --quick is a smoke test of the machinery.
    result["machine"]["load_average_after"] = os.getloadavg()
    result["targets"] = [] if args.quick else targets(result["rope"], result["attention"])
    if result["targets"]:
        print(_targets_table(result["targets"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return 0


def _repeat(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--repeat must be an integer >= 1, got {value!r}")
    return n


def add_commands(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark RoPE and ALiBi attention (table on stdout, --out for JSON)",
        description="Benchmark posenc's fused RoPE against copy bandwidth and transformers' eager code, and ALiBi "
                    "attention at long context against SDPA with a materialised bias and causal SDPA.",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds: a smoke test")
    p.add_argument("--out", metavar="FILE.json", help="also write the results as JSON")
    p.add_argument("--only", choices=("rope", "attention"), help="run one half only")
    p.add_argument("--repeat", type=_repeat, help="timed repetitions per case (default 11 for RoPE, 3 for attention)")
    p.set_defaults(func=run_bench)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="posenc")
    add_commands(parser.add_subparsers())
    ns = parser.parse_args(["bench", *sys.argv[1:]])
    sys.exit(ns.func(ns))
