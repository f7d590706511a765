"""The papers' claims about each encoding, one function per section, each checked in numbers computed now.

Every number comes from posenc's public modules and its numpy reference (:mod:`posenc.reference`);
nothing is copied from the text. :mod:`.tour` prints them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

import posenc
from posenc import ALiBi, LearnedEmbedding, NoPositionalEncoding, RotaryEmbedding, SinusoidalEncoding
from posenc import reference as R


@dataclass
class Claim:
    section: str
    text: str
    evidence: str
    holds: bool


def _slowest_frequency(head_dim: int) -> float:
    """omega of the last (slowest) pair of default RoPE, in float64."""
    return float(posenc.rope_frequencies(head_dim, dtype=torch.float64)[0][-1])


def _self_attention_outputs(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """One bidirectional 2-head self-attention layer over x (seq, 16) with the given scheme; (seq, 16)."""
    d, h = x.shape[-1], 2
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = (torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d) for _ in range(3))
    absolute = {"sinusoidal": SinusoidalEncoding(d), "learned": LearnedEmbedding(x.shape[0], d).double()}
    x = absolute.get(scheme, NoPositionalEncoding())(x)

    def heads(t: torch.Tensor) -> torch.Tensor:  # (seq, d) -> (1, h, seq, d / h)
        return t.view(-1, h, d // h).transpose(0, 1)[None]

    out = posenc.attention(
        heads(x @ wq),
        heads(x @ wk),
        heads(x @ wv),
        rotary=RotaryEmbedding(d // h) if scheme == "rope" else None,
        bias=ALiBi(h) if scheme == "alibi" else None,
        causal=False,
    )
    return out[0].transpose(0, 1).reshape(-1, d)


def permutation_claims() -> list[Claim]:
    """Why position matters: without positions self-attention commutes with a permutation; each scheme
    breaks that."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g, dtype=torch.float64)  # "the cat sat on the mat"
    perm = torch.tensor([1, 0, 2, 3, 4, 5])  # swap two tokens
    claims = []
    for scheme in ["none", "sinusoidal", "learned", "rope", "alibi"]:
        out, permuted = _self_attention_outputs(x, scheme), _self_attention_outputs(x[perm], scheme)
        gap = float((permuted - out[perm]).abs().max())
        if scheme == "none":
            text, holds, shown = (
                "self-attention is permutation-equivariant: A(pi X) = pi A(X)",
                gap < 1e-12,
                f"{gap:.1e}",
            )
        else:
            text, holds, shown = f"{scheme} breaks the symmetry", gap > 1e-3, f"{gap:.3f}"
        claims.append(Claim("Why position matters", text, f"max |A(pi X) - pi A(X)| = {shown}", holds))
    return claims


def sinusoidal_claims() -> list[Claim]:
    """Sinusoidal: range, sin/cos pairs, fast and slow dimensions, the slowest period, shift = rotation."""
    pe = SinusoidalEncoding(64).table(100).double().numpy()
    pair = pe[:, 0] ** 2 + pe[:, 1] ** 2
    fast, slow = abs(pe[0, 0] - pe[1, 0]), abs(pe[0, 62] - pe[1, 62])
    slowest_period = 2 * math.pi / R.inverse_frequencies(512)[-1]
    shift_err = max(
        float(np.abs(pe[p + 7] - R.sinusoidal_shift_matrix(7, 64) @ pe[p]).max()) for p in range(90)
    )
    parameters = sum(p.numel() for p in SinusoidalEncoding(512).parameters())
    section = "Sinusoidal"
    return [
        Claim(
            section,
            "values lie in [-1, 1]",
            f"range [{pe.min():.3f}, {pe.max():.3f}]",
            pe.min() >= -1 and pe.max() <= 1,
        ),
        Claim(
            section,
            "adjacent dims are a sin/cos pair at one frequency",
            f"sin^2 + cos^2 in [{pair.min():.6f}, {pair.max():.6f}]",
            bool(np.allclose(pair, 1.0)),
        ),
        Claim(
            section,
            "left dims oscillate fast, right dims slowly (d=64)",
            f"|PE[1]-PE[0]|: dim 0 {fast:.3f}, dim 62 {slow:.6f}",
            fast > 0.5 and slow < 1e-3,
        ),
        Claim(
            section,
            "slowest period at d_model=512 is roughly 62,000 positions",
            f"2 pi / omega_255 = {slowest_period:,.0f} (rounding omega_255 to 1/10000 gives 62,832)",
            55_000 < slowest_period < 65_000,
        ),
        Claim(section, "no parameters", f"{parameters} parameters", parameters == 0),
        Claim(
            section,
            "PE(p + 7) = M(7) PE(p), M a fixed rotation independent of p",
            f"max error over p = 0..89: {shift_err:.1e}",
            shift_err < 1e-5,
        ),
    ]


def _raises_index_error(fn: Callable[[], object]) -> str | None:
    """The first clause of the IndexError ``fn`` raises, or None when it raises none."""
    try:
        fn()
    except IndexError as error:
        return str(error).split(":")[0]
    return None


def learned_claims() -> list[Claim]:
    """Learned: the size of GPT-2's table, and no row past its end."""
    gpt2 = sum(p.numel() for p in LearnedEmbedding(1024, 768).parameters())
    message = _raises_index_error(lambda: LearnedEmbedding(32, 32)(torch.zeros(1, 1, 32), offset=64))
    return [
        Claim(
            "Learned",
            "GPT-2 small's table (1024 x 768) has about 800,000 parameters",
            f"{gpt2:,} parameters",
            750_000 < gpt2 < 850_000,
        ),
        Claim(
            "Learned",
            "no row for a position past the table: it cannot extrapolate",
            message or "no error",
            message is not None,
        ),
    ]


def rope_claims() -> list[Claim]:
    """RoPE: relative scores, norms kept, accurate angles at 10 million positions."""
    rope = RotaryEmbedding(8)
    rng = np.random.default_rng(42)
    q = torch.from_numpy(rng.normal(0, 1, (1, 8)))
    k = torch.from_numpy(rng.normal(0, 1, (1, 8)))
    pairs = [(0, 5), (3, 8), (10, 15), (50, 55), (1000, 1005)]
    dots = [float((rope.rotate(q, offset=m) * rope.rotate(k, offset=n)).sum()) for m, n in pairs]
    x = torch.randn(4, 10, 64, dtype=torch.float64)
    norm_err = float((RotaryEmbedding(64).rotate(x).norm(dim=-1) - x.norm(dim=-1)).abs().max())
    parameters = sum(p.numel() for p in RotaryEmbedding(64).parameters())
    far = torch.arange(9_999_990, 10_000_000)
    y = torch.randn(1, 10, 128)
    got = RotaryEmbedding(128).rotate(y, positions=far).double().numpy()
    far_err = float(np.abs(got - R.rope(y.double().numpy(), far.numpy())).max())
    return [
        Claim(
            "RoPE",
            "q.k depends only on n - m: " + ", ".join(f"({m},{n})" for m, n in pairs),
            "dots " + ", ".join(f"{d:.6f}" for d in dots),
            max(dots) - min(dots) < 1e-9,
        ),
        Claim(
            "RoPE",
            "a rotation: vector norms unchanged, no parameters",
            f"max norm change {norm_err:.1e}, {parameters} parameters",
            norm_err < 1e-12 and parameters == 0,
        ),
        Claim(
            "RoPE",
            "angles stay accurate at 10 million positions (float32 vs float64)",
            f"max error {far_err:.1e}",
            far_err < 1e-5,
        ),
    ]


def alibi_claims() -> list[Claim]:
    """ALiBi: the slopes, the bias row of one query, and its dependence on distance only."""
    slopes = ALiBi(4).slopes.tolist()
    row = ALiBi(4).bias(16, causal=False)[0, 8]
    bias = ALiBi(4).bias(4096, causal=True)
    far, near = bias[:, 3000, 2995], bias[:, 8, 3]
    monotone = bool((row[:9].diff() > 0).all() and (row[8:].diff() < 0).all())
    return [
        Claim(
            "ALiBi",
            "slopes m_h = 2^(-8h/H) for H = 4",
            ", ".join(f"{s:g}" for s in slopes),
            bool(np.allclose(slopes, [2 ** (-8 * h / 4) for h in range(1, 5)])),
        ),
        Claim(
            "ALiBi",
            "head 1, query 8: a V of -m |i - j|, more negative with distance",
            " ".join(f"{v:.2f}" for v in row.tolist()),
            monotone,
        ),
        Claim(
            "ALiBi",
            "offset 5 gets the same bias at position 3000 as at position 8",
            f"{far.tolist()[0]:.4f} vs {near.tolist()[0]:.4f}",
            bool(torch.equal(far, near)),
        ),
    ]


def extrapolation_claims() -> list[Claim]:
    """Length extrapolation: which schemes are defined past the training length; what PI does to angles."""
    learned = _raises_index_error(lambda: LearnedEmbedding(2048, 16)(torch.zeros(1, 1, 16), offset=2048))
    sinus = bool(torch.isfinite(SinusoidalEncoding(16).table(8192)).all())
    alibi = bool(torch.isfinite(ALiBi(8).bias(64, 8192)[:, :, :64]).all())
    omega = _slowest_frequency(64)
    theta_max, theta_pi = 8191 * omega, 8191 / 4 * omega
    section = "Length extrapolation"
    return [
        Claim(
            section,
            "learned PE fails at once past L = 2048",
            "IndexError at position 2048" if learned else "no error",
            bool(learned),
        ),
        Claim(
            section,
            "sinusoidal PE, ALiBi and RoPE are defined at L = 8192",
            f"finite: sinusoidal {sinus}, ALiBi {alibi}",
            sinus and alibi,
        ),
        Claim(
            section,
            "position interpolation (x1/4) keeps 8192 tokens' angles in the 2048-token range",
            f"slowest angle at 8191: {theta_max:.3f} rad raw, {theta_pi:.3f} rad with PI "
            f"(2047: {2047 * omega:.3f})",
            theta_pi <= 2047.75 * omega,
        ),
    ]


def _shaw_output_at(shaw, q, k, v, positions: torch.Tensor) -> torch.Tensor:
    """Shaw et al.'s bidirectional attention with every token at the given positions, by hand from the
    module's tables: softmax((q k^T + q a^K_{c(j-i)}) / sqrt(d)) (v + a^V_{c(j-i)})."""
    scores = (q @ k.transpose(-1, -2) + shaw.key_bias(q, positions, positions)) / math.sqrt(q.shape[-1])
    p = torch.softmax(scores, -1)
    return p @ v + torch.einsum("...ij,ijd->...id", p, shaw.value_table[shaw.rows(positions, positions)])


def shaw_claims() -> list[Claim]:
    """Shaw et al. 2018: scores depend on the clipped relative distance only; no per-position parameters."""
    shaw = posenc.ShawRelative(16, max_distance=16).double()
    g = torch.Generator().manual_seed(0)
    for table in shaw.parameters():  # drawn from g: the evidence is the same on every run
        table.data.copy_(torch.randn(table.shape, generator=g, dtype=torch.float64))
    q, k, v = (torch.randn(1, 2, 48, 16, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(48)
    out = shaw.attend(q, k, v, causal=False)
    shift_err = max(
        float((_shaw_output_at(shaw, q, k, v, pos + s) - out).abs().max()) for s in (0, 1000, 10**6)
    )
    far = shaw.key_bias(q, pos, pos)[0, 0, 40, [20, 10, 0]]  # query 40, keys 20, 30 and 40 before it
    params = sum(p.numel() for p in shaw.parameters())
    finite = [
        bool(torch.isfinite(shaw.attend(*(torch.randn(1, 1, n, 16, generator=g) for _ in range(3)))).all())
        for n in (8, 5000)
    ]
    section = "Shaw relative positions"
    return [
        Claim(
            section,
            "scores depend on the clipped distance j - i only: shifting all positions leaves the output",
            f"max |out(p + s) - out(p)| over s = 0, 1000, 10^6: {shift_err:.1e}",
            shift_err < 1e-12,
        ),
        Claim(
            section,
            "pairs at distances 20, 30, 40 (all beyond k = 16) get one bias term",
            "q_40 . a^K: " + ", ".join(f"{x:.6f}" for x in far.tolist()),
            bool((far == far[0]).all()),
        ),
        Claim(
            section,
            "no parameters per absolute position: any length runs on the same 2 (2k + 1) d parameters",
            f"{params:,} parameters (k = 16, d = 16); finite output: L = 8 {finite[0]}, L = 5000 {finite[1]}",
            params == 2 * 33 * 16 and all(finite),
        ),
    ]


SECTIONS: list[Callable[[], list[Claim]]] = [
    permutation_claims,
    sinusoidal_claims,
    learned_claims,
    rope_claims,
    alibi_claims,
    extrapolation_claims,
    shaw_claims,
]
"""The sections, from absolute encodings to length extrapolation."""
