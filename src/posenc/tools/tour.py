"""``posenc tour``: the papers' claims about each encoding (:mod:`.claims`), each checked in numbers.

``--out DIR`` also writes ``tour.png``, a sheet of figures built by :func:`tour_figure`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from posenc import ALiBi, RotaryEmbedding, SinusoidalEncoding
from posenc.cli import guarded

from .claims import SECTIONS, Claim
from .plot import save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def run_claims() -> list[Claim]:
    """Check every claim of :data:`SECTIONS`; returns them in :data:`SECTIONS`' order."""
    with torch.no_grad():
        return [claim for section in SECTIONS for claim in section()]


def format_claims(claims: list[Claim]) -> str:
    """One block per section, a line per claim ([ok] or [FAILS], then its evidence), and a count."""
    lines, section = [], None
    for claim in claims:
        if claim.section != section:
            section = claim.section
            lines.append(f"\n== {section} ==")
        lines.append(f"  [{'ok' if claim.holds else 'FAILS'}] {claim.text}\n         {claim.evidence}")
    held = sum(c.holds for c in claims)
    lines.append(f"\n{held} of {len(claims)} claims hold.")
    return "\n".join(lines)


def _rope_scores(head_dim: int, max_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """q.k / head_dim for q = k = ones, q at position 0 and k at each offset 0..max_offset."""
    rope = RotaryEmbedding(head_dim)
    offsets = torch.arange(0, max_offset + 1)
    ones = torch.ones(1, head_dim, dtype=torch.float64)
    q = rope.rotate(ones, positions=torch.zeros(1, dtype=torch.long))
    k = rope.rotate(ones.expand(len(offsets), head_dim).contiguous(), positions=offsets)
    return offsets.numpy(), ((k @ q.T)[:, 0] / head_dim).numpy()


def tour_figure() -> Figure:
    """Three panels: the sinusoidal table (d_model 128, 256 positions) as an image with a colorbar, the
    RoPE score against offset (one line), and the ALiBi bias of the last of 64 queries (a line per head)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 4.6), dpi=110)
    sinus_ax, rope_ax, alibi_ax = fig.subplots(1, 3)
    pe = SinusoidalEncoding(128).table(256).numpy()
    im = sinus_ax.imshow(pe.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    sinus_ax.set(title="Sinusoidal PE (d_model = 128)", xlabel="position p", ylabel="dimension")
    fig.colorbar(im, ax=sinus_ax, fraction=0.046)

    rope_ax.plot(*_rope_scores(128, 2048), lw=0.8)
    rope_ax.set(title="RoPE: q.k against offset n - m (q = k = 1)", xlabel="offset n - m", ylabel="score / d")
    rope_ax.set_xscale("symlog", linthresh=10)

    alibi = ALiBi(8)
    bias = alibi.bias(64, causal=True)[:, -1].detach().numpy()
    for h, (row, slope) in enumerate(zip(bias, alibi.slopes.tolist(), strict=True)):
        alibi_ax.plot(np.arange(64), row, label=f"head {h + 1}: m = {slope:.4g}")
    alibi_ax.set(title="ALiBi bias for the last query (8 heads)", xlabel="key position j (query at 63)")
    alibi_ax.set_ylabel("bias")
    alibi_ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@guarded("tour")
def run(args: argparse.Namespace) -> int:
    """Print every claim (and write the figure sheet with --out); exit code 1 when one fails."""
    if args.out:  # before the claims, so a bad --out does not cost their run first
        from posenc.cli import check_matplotlib, check_output_dir, check_output_file

        check_output_dir("--out", args.out)
        check_output_file("--out", Path(args.out) / "tour.png")  # DIR/tour.png must not be a folder
        check_matplotlib("--out (the figure sheet tour.png)")
    start = time.perf_counter()
    claims = run_claims()
    print("posenc tour: the papers' claims about each encoding, checked in numbers")
    print(format_claims(claims))
    if args.out:
        path = save_figure(tour_figure(), Path(args.out) / "tour.png")
        print(f"figures: {path}")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0 if all(c.holds for c in claims) else 1


def add_commands(subparsers) -> None:
    """Add ``posenc tour``."""
    p = subparsers.add_parser(
        "tour", help="the papers' claims about each encoding checked in numbers, with a sheet of figures"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="also write DIR/tour.png (sinusoidal heatmap, RoPE score vs offset, ALiBi bias per head)",
    )
    p.set_defaults(func=run)
