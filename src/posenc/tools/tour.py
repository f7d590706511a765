"""``posenc tour``: the chapter's claims, each checked in numbers, in the chapter's order.

Every number is computed here, now, by posenc's own modules and its numpy reference; nothing is
copied from the text. ``--out DIR`` also writes ``tour.png``, a sheet of figures.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import reference as R
from ..absolute import LearnedEmbedding, NoPositionalEncoding, SinusoidalEncoding
from ..attention import attention
from ..bias import ALiBi
from ..rope import RotaryEmbedding


@dataclass
class Claim:
    section: str
    text: str
    evidence: str
    holds: bool


def _self_attention_outputs(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """One bidirectional 2-head self-attention layer over x (seq, 16) with the given scheme; (seq, 16)."""
    d, h = x.shape[-1], 2
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = (torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d) for _ in range(3))
    absolute = {"sinusoidal": SinusoidalEncoding(d), "learned": LearnedEmbedding(x.shape[0], d).double()}
    x = absolute.get(scheme, NoPositionalEncoding())(x)
    split = lambda t: t.view(-1, h, d // h).transpose(0, 1)[None]  # noqa: E731
    out = attention(
        split(x @ wq),
        split(x @ wk),
        split(x @ wv),
        rotary=RotaryEmbedding(d // h) if scheme == "rope" else None,
        bias=ALiBi(h) if scheme == "alibi" else None,
        causal=False,
    )
    return out[0].transpose(0, 1).reshape(-1, d)


def _permutation_claims() -> list[Claim]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g, dtype=torch.float64)  # "the cat sat on the mat"
    perm = torch.tensor([1, 0, 2, 3, 4, 5])  # swap two tokens
    claims = []
    for scheme in ["none", "sinusoidal", "learned", "rope", "alibi"]:
        gap = float((_self_attention_outputs(x[perm], scheme) - _self_attention_outputs(x, scheme)[perm]).abs().max())
        if scheme == "none":
            claims.append(Claim("Why position matters", "self-attention is permutation-equivariant: A(pi X) = pi A(X)",
                                f"max |A(pi X) - pi A(X)| = {gap:.1e}", gap < 1e-12))
        else:
            claims.append(Claim("Why position matters", f"{scheme} breaks the symmetry",
                                f"max |A(pi X) - pi A(X)| = {gap:.3f}", gap > 1e-3))
    return claims


def _sinusoidal_claims() -> list[Claim]:
    pe = SinusoidalEncoding(64).table(100).double().numpy()
    pair = pe[:, 0] ** 2 + pe[:, 1] ** 2
    fast, slow = abs(pe[0, 0] - pe[1, 0]), abs(pe[0, 62] - pe[1, 62])
    slowest_period = 2 * math.pi / R.inverse_frequencies(512)[-1]
    shift_err = max(
        float(np.abs(pe[p + 7] - R.sinusoidal_shift_matrix(7, 64) @ pe[p]).max()) for p in range(0, 90)
    )
    return [
        Claim("Sinusoidal", "values lie in [-1, 1]", f"range [{pe.min():.3f}, {pe.max():.3f}]", pe.min() >= -1 and pe.max() <= 1),
        Claim("Sinusoidal", "adjacent dims are a sin/cos pair at one frequency", f"sin^2 + cos^2 in [{pair.min():.6f}, {pair.max():.6f}]",
              bool(np.allclose(pair, 1.0))),
        Claim("Sinusoidal", "left dims oscillate fast, right dims slowly (d=64)", f"|PE[1]-PE[0]|: dim 0 {fast:.3f}, dim 62 {slow:.6f}",
              fast > 0.5 and slow < 1e-3),
        Claim("Sinusoidal", "slowest period at d_model=512 is roughly 62,000 positions",
              f"2 pi / omega_255 = {slowest_period:,.0f} (the chapter rounds omega_255 to 1/10000: 62,832)",
              55_000 < slowest_period < 65_000),
        Claim("Sinusoidal", "no parameters", f"{sum(p.numel() for p in SinusoidalEncoding(512).parameters())} parameters",
              not list(SinusoidalEncoding(512).parameters())),
        Claim("Sinusoidal", "PE(p + 7) = M(7) PE(p), M a fixed rotation independent of p",
              f"max error over p = 0..89: {shift_err:.1e}", shift_err < 1e-5),
    ]


def _learned_claims() -> list[Claim]:
    gpt2 = sum(p.numel() for p in LearnedEmbedding(1024, 768).parameters())
    table = LearnedEmbedding(32, 32)
    try:
        table(torch.zeros(1, 1, 32), offset=64)
        message, raised = "no error", False
    except IndexError as error:
        message, raised = str(error).split(":")[0], True
    return [
        Claim("Learned", "GPT-2 small's table (1024 x 768) has about 800,000 parameters", f"{gpt2:,} parameters", 750_000 < gpt2 < 850_000),
        Claim("Learned", "no row for a position past the table: it cannot extrapolate", message, raised),
    ]


def _rope_claims() -> list[Claim]:
    rope = RotaryEmbedding(8)
    rng = np.random.default_rng(42)
    q = torch.from_numpy(rng.normal(0, 1, (1, 8)))
    k = torch.from_numpy(rng.normal(0, 1, (1, 8)))
    pairs = [(0, 5), (3, 8), (10, 15), (50, 55), (1000, 1005)]
    dots = [float((rope.rotate(q, offset=m) * rope.rotate(k, offset=n)).sum()) for m, n in pairs]
    spread = max(dots) - min(dots)
    x = torch.randn(4, 10, 64, dtype=torch.float64)
    norm_err = float((RotaryEmbedding(64).rotate(x).norm(dim=-1) - x.norm(dim=-1)).abs().max())
    far = torch.arange(9_999_990, 10_000_000)
    y = torch.randn(1, 10, 128)
    far_err = float(np.abs(RotaryEmbedding(128).rotate(y, positions=far).double().numpy()
                           - R.rope(y.double().numpy(), far.numpy())).max())
    return [
        Claim("RoPE", "q.k depends only on n - m: " + ", ".join(f"({m},{n})" for m, n in pairs),
              "dots " + ", ".join(f"{d:.6f}" for d in dots), spread < 1e-9),
        Claim("RoPE", "a rotation: vector norms unchanged, no parameters",
              f"max norm change {norm_err:.1e}, {sum(p.numel() for p in RotaryEmbedding(64).parameters())} parameters", norm_err < 1e-12),
        Claim("RoPE", "angles stay accurate at 10 million positions (float32 vs float64)", f"max error {far_err:.1e}", far_err < 1e-5),
    ]


def _alibi_claims() -> list[Claim]:
    slopes = ALiBi(4).slopes.tolist()
    row = ALiBi(4).bias(16, causal=False)[0, 8]
    bias = ALiBi(4).bias(4096, causal=True)
    far, near = bias[:, 3000, 2995], bias[:, 8, 3]
    monotone = bool((row[:9].diff() > 0).all() and (row[8:].diff() < 0).all())
    return [
        Claim("ALiBi", "slopes m_h = 2^(-8h/H) for H = 4", ", ".join(f"{s:g}" for s in slopes),
              bool(np.allclose(slopes, [2 ** (-8 * h / 4) for h in range(1, 5)]))),
        Claim("ALiBi", "head 1, query 8: a V of -m |i - j|, more negative with distance",
              " ".join(f"{v:.2f}" for v in row.tolist()), monotone),
        Claim("ALiBi", "offset 5 gets the same bias at position 3000 as at position 8",
              f"{far.tolist()[0]:.4f} vs {near.tolist()[0]:.4f}", bool(torch.equal(far, near))),
    ]


def _extrapolation_claims() -> list[Claim]:
    try:
        LearnedEmbedding(2048, 16)(torch.zeros(1, 1, 16), offset=2048)
        learned = False
    except IndexError:
        learned = True
    sinus = bool(torch.isfinite(SinusoidalEncoding(16).table(8192)).all())
    alibi = bool(torch.isfinite(ALiBi(8).bias(64, 8192)[:, :, :64]).all())
    rope = RotaryEmbedding(64)
    theta_max = 8191 * rope.inv_freq[-1].item()
    theta_pi = 8191 / 4 * rope.inv_freq[-1].item()
    return [
        Claim("Length extrapolation", "learned PE fails at once past L = 2048", "IndexError at position 2048" if learned else "no error", learned),
        Claim("Length extrapolation", "sinusoidal PE, ALiBi and RoPE are defined at L = 8192", f"finite: sinusoidal {sinus}, ALiBi {alibi}",
              sinus and alibi),
        Claim("Length extrapolation", "position interpolation (x1/4) keeps 8192 tokens' angles in the 2048-token range",
              f"slowest angle at 8191: {theta_max:.3f} rad raw, {theta_pi:.3f} rad with PI (2047: {2047 * rope.inv_freq[-1].item():.3f})",
              theta_pi <= 2047.75 * rope.inv_freq[-1].item()),
    ]


SECTIONS: list[Callable[[], list[Claim]]] = [
    _permutation_claims,
    _sinusoidal_claims,
    _learned_claims,
    _rope_claims,
    _alibi_claims,
    _extrapolation_claims,
]


def run_claims() -> list[Claim]:
    """Check every claim; returns them in the chapter's order."""
    with torch.no_grad():
        return [claim for section in SECTIONS for claim in section()]


def draw_figures(path: Path) -> Path:
    """Write the tour's sheet: sinusoidal heatmap, RoPE score against offset, ALiBi bias per head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    pe = SinusoidalEncoding(128).table(256).numpy()
    im = axes[0].imshow(pe.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    axes[0].set(title="Sinusoidal PE (d_model = 128)", xlabel="position p", ylabel="dimension")
    fig.colorbar(im, ax=axes[0], fraction=0.046)

    rope = RotaryEmbedding(128)
    offsets = torch.arange(0, 2049)
    ones = torch.ones(1, 128, dtype=torch.float64)
    q = rope.rotate(ones, positions=torch.zeros(1, dtype=torch.long))
    k = rope.rotate(ones.expand(len(offsets), 128).contiguous(), positions=offsets)
    scores = (k @ q.T)[:, 0] / 128
    axes[1].plot(offsets.numpy(), scores.numpy(), lw=0.8)
    axes[1].set(title="RoPE: q.k against offset n - m (q = k = 1)", xlabel="offset n - m", ylabel="score / d")
    axes[1].set_xscale("symlog", linthresh=10)

    alibi = ALiBi(8)
    bias = alibi.bias(64, causal=True)[:, -1].numpy()
    for h, (row, slope) in enumerate(zip(bias, alibi.slopes.tolist(), strict=True)):
        axes[2].plot(np.arange(64), row, label=f"head {h + 1}: m = {slope:.4g}")
    axes[2].set(title="ALiBi bias for the last query (8 heads)", xlabel="key position j (query at 63)", ylabel="bias")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_claims(claims: list[Claim]) -> str:
    lines, section = [], None
    for claim in claims:
        if claim.section != section:
            section = claim.section
            lines.append(f"\n== {section} ==")
        lines.append(f"  [{'ok' if claim.holds else 'FAILS'}] {claim.text}\n         {claim.evidence}")
    held = sum(c.holds for c in claims)
    lines.append(f"\n{held} of {len(claims)} claims hold.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    claims = run_claims()
    print("posenc tour: the chapter's claims, checked in numbers")
    print(format_claims(claims))
    if args.out:
        path = draw_figures(Path(args.out) / "tour.png")
        print(f"figures: {path}")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0 if all(c.holds for c in claims) else 1


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("tour", help="the chapter's claims checked in numbers, with a sheet of figures")
    p.add_argument("--out", metavar="DIR", help="also write DIR/tour.png (sinusoidal heatmap, RoPE score vs offset, ALiBi bias per head)")
    p.set_defaults(func=run)
