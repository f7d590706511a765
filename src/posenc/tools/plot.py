"""``posenc plot ...``: pictures of what the encodings do.

``posenc plot frequencies [--factor 8 --head-dim 128 --base 10000 --original-length 4096 --out FILE.png]``
draws the wavelength 2 pi / omega_k of every dimension pair under each context-extension method at one
factor, on a log scale. Position interpolation lifts the whole spectrum by the factor; NTK-aware scaling
leaves the fastest pair and lifts the slowest by the factor, smoothly in between; YaRN and Llama 3.1 keep
the pairs that turn many times within the original context, interpolate those that turn less than
once, and ramp in between.

matplotlib (Agg backend) is imported only when a plot is drawn.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from ..rope import frequencies as F

__all__ = ["add_commands", "plot_frequencies", "wavelengths"]


def wavelengths(head_dim: int = 128, base: float = 10000.0, factor: float = 8.0, original_length: int = 4096) -> dict[str, np.ndarray]:
    """Wavelength (tokens per full turn) of each of the head_dim/2 pairs under each method. Shape (head_dim/2,) each.

    YaRN uses its paper's beta_fast=32, beta_slow=1; Llama 3.1 its published low/high_freq_factor 1 and 4.
    """
    F.parse_scaling({"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": original_length, "rope_theta": base})  # validates all four
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 4 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 4, got {head_dim!r}")
    schedules = {
        "default RoPE": F.default_frequencies(head_dim, base=base),
        f"PI (linear) x{factor:g}": F.linear_frequencies(head_dim, base=base, factor=factor),
        "NTK-aware": F.ntk_frequencies(head_dim, base=base, factor=factor),
        "YaRN": F.yarn_frequencies(head_dim, base=base, factor=factor, original_max_position_embeddings=original_length),
        "Llama 3.1": F.llama3_frequencies(
            head_dim, base=base, factor=factor, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=original_length,
        ),
    }
    return {name: (2 * math.pi / inv).numpy() for name, (inv, _) in schedules.items()}


def plot_frequencies(
    out: str | Path = "frequencies.png",
    head_dim: int = 128,
    base: float = 10000.0,
    factor: float = 8.0,
    original_length: int = 4096,
) -> Path:
    """Draw :func:`wavelengths` to a PNG file and return its path."""
    waves = wavelengths(head_dim, base, factor, original_length)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    pairs = np.arange(head_dim // 2)
    styles = ["-", "--", "-.", "-", ":"]
    for (name, w), style in zip(waves.items(), styles, strict=True):
        ax.plot(pairs, w, style, label=name, linewidth=2 if name in ("YaRN", "Llama 3.1") else 1.5)
    ax.axhline(original_length, color="grey", linewidth=0.8)
    ax.axhline(original_length * factor, color="grey", linewidth=0.8, linestyle="--")
    ax.text(0, original_length * 1.15, f"original context {original_length:,}", color="grey", fontsize=8)
    ax.text(0, original_length * factor * 1.15, f"extended context {int(original_length * factor):,}", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("dimension pair k (fast to slow)")
    ax.set_ylabel("wavelength 2\u03c0/\u03c9\u2096 (tokens)")
    ax.set_title(f"RoPE wavelengths at factor {factor:g} (head_dim {head_dim}, base {base:g})")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _frequencies_command(args: argparse.Namespace) -> int:
    try:
        path = plot_frequencies(args.out, args.head_dim, args.base, args.factor, args.original_length)
    except ValueError as err:
        print(f"posenc plot frequencies: error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def add_commands(subparsers) -> None:
    plot = subparsers.add_parser("plot", help="draw pictures of positional encodings")
    kinds = plot.add_subparsers(dest="plot", metavar="WHAT")
    plot.set_defaults(func=lambda args: (plot.print_help(), 2)[1])
    freq = kinds.add_parser(
        "frequencies",
        help="wavelength of each RoPE dimension pair under default, PI, NTK, YaRN and Llama 3.1 scaling",
        description=__doc__.split("\n\n")[1],
    )
    freq.add_argument("--factor", type=float, default=8.0, help="context extension factor (default 8)")
    freq.add_argument("--head-dim", type=int, default=128, help="head dimension (default 128)")
    freq.add_argument("--base", type=float, default=10000.0, help="RoPE base, rope_theta (default 10000)")
    freq.add_argument("--original-length", type=int, default=4096, help="pretraining context length (default 4096)")
    freq.add_argument("--out", default="frequencies.png", help="output PNG file (default frequencies.png)")
    freq.set_defaults(func=_frequencies_command)
