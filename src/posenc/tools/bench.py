"""``posenc bench``: RoPE throughput, long-context ALiBi attention and every score bias, as a table and as
JSON.

``--device cpu`` (the default) and ``--device cuda`` run the same code (:mod:`posenc.tools.benchmarks`)
with each device's sizes (:mod:`.benchmarks.presets`); on CUDA, k has a quarter of q's heads (GQA),
forward + backward is timed too, and bandwidth is also given as a share of the nominal HBM peak. A full
CPU run is checked against the targets of :mod:`.benchmarks.targets` (reported, not asserted).
The score biases (:mod:`.benchmarks.biases`) run at their full lengths with ``--only bias``; a plain run
measures them at the preset's shorter ``bias_default_lengths``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

from posenc.cli import guarded


def _machine(device) -> dict:
    """What the numbers were measured on; the load average, because other processes skew every timing."""
    import torch

    from .benchmarks.rope import nominal_hbm

    info = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), nominal_hbm_gb_per_s=nominal_hbm(device))
    return info


def _summary(machine: dict) -> str:
    gpu = f", {machine['gpu']}" if "gpu" in machine else ""
    return (
        f"torch {machine['torch']}, {machine['threads']} threads, {machine['cpus']} CPUs{gpu}, "
        f"load average {machine['load_average_before'][0]:.1f} at start"
    )


@guarded("bench")
def run_bench(args: argparse.Namespace) -> int:
    """Run the parts ``--only`` selects on ``--device``, print their tables, write ``--out``."""
    import torch

    from posenc.cli import check_output_file

    if args.out:  # before the benchmarks, which take minutes
        check_output_file("--out", args.out)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine")
    from .benchmarks import presets, targets
    from .benchmarks.registry import BENCHMARKS, Context

    preset = presets.preset(device, args.quick)
    chosen = BENCHMARKS.get(args.only)
    full = chosen is not None and chosen.full_lengths
    lengths = preset.bias_lengths if full else preset.bias_default_lengths
    context = Context(preset, device, bool(args.quick), args.repeat, lengths)
    result = {"device": device.type, "quick": bool(args.quick), "machine": _machine(device)}
    print(_summary(result["machine"]))
    for name, bench in BENCHMARKS.items():
        asked = args.only == name or (args.only is None and bench.by_default)
        result[name] = bench.rows(context) if asked else []
        if result[name]:
            print(bench.format(result[name]) + "\n", flush=True)
    result["machine"]["load_average_after"] = os.getloadavg()
    # The targets are about the full CPU shapes; --quick is a smoke test of the machinery.
    full_cpu = device.type == "cpu" and not args.quick
    rows = (result["rope"], result["attention"], result["serving"], result["bias"])
    result["targets"] = targets.targets(*rows) if full_cpu else []
    if result["targets"]:
        print(targets.targets_table(result["targets"]))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return 0


def add_commands(subparsers) -> None:
    """Add ``posenc bench``."""
    from posenc.cli import positive_int

    p = subparsers.add_parser(
        "bench",
        help="benchmark RoPE, ALiBi attention and the score biases on the CPU or CUDA (table on stdout, "
        "--out for JSON)",
        description="Benchmark posenc's RoPE against copy bandwidth and transformers' eager code, and ALiBi "
        "attention and every score bias at long context against SDPA with a materialised bias and causal "
        "SDPA.",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to run (default cpu); cuda adds GQA, forward + backward and the share of nominal HBM",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds: a smoke test")
    p.add_argument("--out", metavar="FILE.json", help="also write the results as JSON")
    from .benchmarks.registry import BENCHMARKS

    p.add_argument(
        "--only",
        choices=tuple(BENCHMARKS),
        help="run one part only: "
        + "; ".join(
            f"{b.name}: {b.help}" + ("" if b.by_default else " (only when asked for)")
            for b in BENCHMARKS.values()
        ),
    )
    p.add_argument(
        "--repeat",
        type=positive_int,
        help="timed repetitions per case (default: RoPE 11 on cpu, 20 on cuda; attention 3 and 5)",
    )
    p.set_defaults(func=run_bench)
