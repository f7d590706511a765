"""FoPE, Fourier Position Embedding (Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's
Periodic Extension for Length Generalization", arxiv.org/abs/2412.17739, ICML 2025).

RoPE gives pair m of a head one frequency omega_m = base^(-2m/head_dim). FoPE changes two things (section 4,
eqs. 11-13):

* clip floor to zero: a frequency below the floor omega_l = 2 pi / L (L the training length) does not complete
  one period in training, so its pair gets the zero frequency: it is left as it is (f = 1, eq. 13);
* Fourier series: every other pair m carries a series over the input frequencies omega_j (those of a RoPE
  schedule of ``fourier_dim`` dimensions that lie at or above the floor; with ``fourier_dim = head_dim``, the
  head's own), separately for its cosine and its sine and separately per head h:

      C[h, p, m] = sum_j Ac[h, j, m] cos(omega_j p) / sum_j Ac[h, j, m]
      S[h, p, m] = sum_j As[h, j, m] sin(omega_j p) / sum_j As[h, j, m]

  and (a, b) of the pair at position p becomes (a C - b S, a S + b C), as RoPE with (cos, sin) = (C, S).

The variant implemented is the one the authors' released code and appendix B pseudo-code run for the paper's
main experiments ("eye_xavier_norm", "sep_basis_head", "ignore_clamp_zero"): Ac and As are separate
(heads, D, M') matrices, D input frequencies and M' pairs at or above the floor, the identity at each pair's
own frequency plus N(0, std^2) noise with std = sigma * sqrt(2 / ((D + heads) M')) (what
``torch.nn.init.xavier_normal_`` with gain sigma gives such a tensor; the paper's sigma is that gain, 0.3 for
its 60M model; a pair whose coefficients would not sum to 1 +- 0.5 is drawn again), normalised by their
column sums as in the pseudo-code (so C = 1 and S = 0 at p = 0), and fixed (appendix B: "gradients are not
required for these matrices"; ``learnable=True`` makes them parameters).
Two details of the released code are not copied, the paper's text being followed instead (appendix B: the
map is D x (M - M0), M0 the zero-frequency pairs): there only min(D, head_dim/4) pairs carry a series, and the
padded pairs get cos = sin = 1 (a fixed 45-degree map times sqrt 2), where here every pair at or above the
floor carries a series and the others are left unchanged.

This is not a pure rotation: C^2 + S^2 != 1, so each pair goes through a position-dependent 2x2 linear map
[[C, -S], [S, C]] (a scaled rotation). q and k go through the same map at their own positions, as in the
paper's code, so a score q.k is a sum over pairs of Re(q_m conj(k_m) z_m(n) conj(z_m(n'))) with
z = C + iS: the dominant frequency gives RoPE's relative term, and products of the noise terms depend on the
absolute positions at second order in the coefficients' noise.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from .._precision import KeepsPrecision
from ..kernels.blocked_common import work_dtype
from .base import Rotary
from .checks import check_x

__all__ = ["FoPE", "fope_frequencies"]

# A normalised series divides by its coefficients' sum, which the identity makes 1; a draw whose sum
# strays from 1 by more than this (towards 0 it would amplify the series without bound) is drawn again, a
# bounded number of times. With the paper's sizes (sigma 0.3, 16+ frequencies) the noise's std is ~0.02
# and no redraw happens; the lab's toy heads (one or two frequencies) need one now and then.
SUM_SLACK = 0.5
MAX_DRAWS = 100


def fope_frequencies(head_dim: int, base: float, train_len: int, fourier_dim: int | None = None):
    """(input frequencies omega_j at or above the floor 2 pi / train_len, float64 (D,); M', the pairs of the
    head whose own frequency is at or above the floor; the index j of pair m's own frequency is m * ratio,
    ratio = fourier_dim / head_dim)."""
    fourier_dim = head_dim if fourier_dim is None else fourier_dim
    floor = 2 * math.pi / train_len
    schedule = base ** (-torch.arange(0, fourier_dim, 2, dtype=torch.float64) / fourier_dim)
    own = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return schedule[schedule >= floor], int((own >= floor).sum())


class FoPE(KeepsPrecision, Rotary):
    """Fourier Position Embedding (Hua et al. 2024, arxiv.org/abs/2412.17739): see the module docstring for
    the formula and the variant.

    Args:
        head_dim: size of each head's query/key vector (even).
        heads: the heads with their own coefficients: q's and k's head count, or k's (grouped-query attention:
            query head i uses key head i // (q_heads / heads)'s).
        train_len: L, the training length; frequencies below 2 pi / L are clipped to zero.
        base: RoPE's base.
        fourier_dim: the RoPE schedule the input frequencies come from (a multiple of head_dim; default
            head_dim, the head's own frequencies, as the paper's main runs).
        sigma: the spread of the coefficients' noise (the paper's sigma, above; 0: RoPE with the floor
            clipped).
        layout: "interleaved" or "half", which dimensions form a pair (as :class:`RotaryEmbedding`).
        learnable: make the coefficients parameters (the paper keeps them fixed).
        generator: the torch generator the coefficients are drawn from (default torch's global one).

    Shape:
        forward(q, k, positions=None, offset=0, *, k_positions=None) -> (q, k): q (batch, q_heads, q_len,
        head_dim), k (batch, k_heads, k_len, head_dim); positions (seq,) or (batch, seq); default: keys at
        offset .. offset+k_len-1 and queries the last q_len of them. rotate(x, positions=None, offset=0) -> x.
        cos_sin(positions) -> (C, S), each (heads, seq, head_dim/2) or (batch, heads, seq, head_dim/2),
        float32. Coefficients ``cos_coef``, ``sin_coef``: (heads, D, M'), kept in the state dict and in
        their dtype through a half-precision cast of the model. The dispatch is :class:`~.base.Rotary`'s:
        this class gives its per-head :meth:`tables`.
    """

    precise_buffers = ("cos_coef", "sin_coef")
    shared_tables = False  # the tables are per head of each tensor: q's and k's counts may differ

    def __init__(
        self,
        head_dim: int,
        heads: int,
        train_len: int,
        base: float = 10000.0,
        *,
        fourier_dim: int | None = None,
        sigma: float = 0.3,
        layout: str = "interleaved",
        learnable: bool = False,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        self.head_dim = _checks.even_int("head_dim", head_dim)
        self.heads = _checks.positive_int("heads", heads, size=True)
        self.train_len = _checks.positive_int("train_len", train_len, position=True)
        self.base = _checks.positive_float("base", base)
        self.sigma = float(_checks.number("sigma", sigma, minimum=0.0))
        self.layout = _checks.layout(layout)
        self.fourier_dim = _fourier_dim(fourier_dim, self.head_dim)
        learnable = _checks.boolean("learnable", learnable)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        freqs, self.active = fope_frequencies(self.head_dim, self.base, self.train_len, self.fourier_dim)
        self._freqs = tuple(freqs.tolist())  # Python floats: a traced call builds its constant from them
        cos_coef, sin_coef = (_draw(self, len(freqs), generator) for _ in range(2))
        for name, coef in (("cos_coef", cos_coef), ("sin_coef", sin_coef)):
            if learnable:
                setattr(self, name, nn.Parameter(coef))
            else:
                self.register_buffer(name, coef)

    @property
    def rotary_dim(self) -> int:
        """Every dimension of a head is in a pair (the clipped pairs with the zero frequency)."""
        return self.head_dim

    @property
    def frequencies(self) -> torch.Tensor:
        """The input frequencies omega_j, (D,) float64."""
        return torch.tensor(self._freqs, dtype=torch.float64)

    def cos_sin(self, positions, offset: int = 0, dtype: torch.dtype = torch.float32):
        """C and S at ``positions`` (+ ``offset``): (heads, seq, head_dim/2), or (batch, heads, seq,
        head_dim/2) for (batch, seq) positions; the pairs below the floor have C = 1, S = 0."""
        if not isinstance(positions, torch.Tensor):
            raise ValueError(f"positions must be a torch.Tensor (seq,) or (batch, seq), got {positions!r}")
        positions = _checks.positions(positions, positions.shape[-1] if positions.dim() else -1)
        p = positions.to(torch.float64) + offset
        angles = p[..., None] * self.frequencies.to(p.device)  # (..., seq, D)
        out = []
        for coef, wave, rest in ((self.cos_coef, torch.cos, 1.0), (self.sin_coef, torch.sin, 0.0)):
            c = coef.to(p.device, torch.float64)
            series = torch.einsum("...sj,hjm->...hsm", wave(angles), c / c.sum(-2, keepdim=True))
            pad = series.new_full((*series.shape[:-1], self.head_dim // 2 - self.active), rest)
            out.append(torch.cat((series, pad), -1).to(dtype))
        return out[0], out[1]

    def tables(self, x: torch.Tensor, positions=None, offset: int = 0, *, kind="q"):
        """C and S for x (batch, heads, seq, head_dim) at ``positions`` (+ ``offset``), else at offset ..:
        (heads, seq, head_dim/2) or (batch, heads, seq, head_dim/2), a query head sharing its key head's
        when x has ``heads`` times more heads (grouped-query attention). Queries and keys (``kind``) go
        through the same maps."""
        check_x(self, "x", x)
        _checks.tensor_rank("x", x, 3)
        _checks.offset(offset)
        if positions is None:
            positions, offset = torch.arange(offset, offset + x.shape[-2], device=x.device), 0
        else:
            _checks.positions(positions, x.shape[-2], x.shape[0])
        cos, sin = self.cos_sin(positions, offset, work_dtype(x.dtype))
        return _per_head(x, cos, sin, self.heads)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, heads={self.heads}, train_len={self.train_len}, base={self.base:g}, "
            f"fourier_dim={self.fourier_dim}, sigma={self.sigma:g}, layout={self.layout!r}, "
            f"frequencies={len(self._freqs)}, series_pairs={self.active}"
        )


def _fourier_dim(fourier_dim, head_dim: int) -> int:
    if fourier_dim is None:
        return head_dim
    fourier_dim = _checks.even_int("fourier_dim", fourier_dim)
    if fourier_dim % head_dim:
        raise ValueError(
            f"fourier_dim={fourier_dim} must be a multiple of head_dim={head_dim}, so that every pair's own "
            "frequency is one of the series' frequencies"
        )
    return fourier_dim


def _draw(fope: FoPE, n_freqs: int, generator) -> torch.Tensor:
    """(heads, D, M'): the identity at each pair's own frequency plus N(0, std^2), std as xavier_normal_'s;
    a pair whose coefficients' sum strays from 1 by more than SUM_SLACK is drawn again (at most MAX_DRAWS
    times)."""
    shape = (fope.heads, n_freqs, fope.active)
    eye = torch.zeros(shape, dtype=torch.float32)
    ratio = fope.fourier_dim // fope.head_dim
    for m in range(fope.active):
        eye[:, m * ratio, m] = 1.0
    if not fope.active or fope.sigma == 0:
        return eye
    std = fope.sigma * math.sqrt(2.0 / ((n_freqs + fope.heads) * fope.active))
    noise = std * torch.randn(shape, generator=generator)
    for _ in range(MAX_DRAWS):
        stray = ((eye + noise).sum(-2) - 1).abs() > SUM_SLACK  # (heads, M')
        if not bool(stray.any()):
            return eye + noise
        noise = torch.where(stray[:, None, :], std * torch.randn(shape, generator=generator), noise)
    raise ValueError(
        f"sigma={fope.sigma:g} is too large for {n_freqs} frequencies and {fope.active} pairs (noise std "
        f"{std:.3g}): {MAX_DRAWS} draws left a pair whose coefficients sum to 1 +- more than "
        f"{SUM_SLACK}, which the normalisation would amplify; use a smaller sigma (the paper: 0.3 to 0.6)"
    )


def _per_head(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int):
    """C, S (..., heads, seq, head_dim/2) for x's heads. The map (a, b) -> (a C - b S, a S + b C) runs on
    RoPE's kernels (:func:`posenc.kernels.apply_rotary`: they take any C, S, and their backward, the map with
    S negated, is the transpose of this one whether or not C^2 + S^2 = 1); a query head shares its key
    head's tables when it has ``heads`` times more heads."""
    n = x.shape[-3]
    if n != heads:
        if n % heads:
            raise ValueError(
                f"x has {n} heads; this FoPE has coefficients for heads={heads}: a head count must be a "
                "multiple of it (grouped-query attention)"
            )
        cos, sin = cos.repeat_interleave(n // heads, -3), sin.repeat_interleave(n // heads, -3)
    return cos, sin
