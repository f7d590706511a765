"""RoPE for images and video: axial frequencies and RoPE-Mixed (Heo et al. 2024, "Rotary Position
Embedding for Vision Transformer", arxiv.org/abs/2403.13298).

A patch at grid coordinates p = (p_1, ..., p_A) (A = 2 for images: row, column; 3 for video: frame,
row, column) rotates pair k of head h by theta_{h,k} = sum_a p_a * f_{a,h,k}. Then q . k depends on the
coordinates only through their difference, in every direction of the grid (sec. 3.1 of the paper).

- RoPE-Axial (sec. 3.2, eq. 9-10): the pairs are split evenly between the axes; pair k of axis a's block
  turns with f = base^(-2A k / head_dim) along that axis and not at all along the others (the paper's
  base is 100 for 2-D images).
- RoPE-Mixed (sec. 3.3, eq. 11-12): every pair turns along every axis, with learnable frequencies per head
  (2, heads, head_dim/2), initialised as the paper's code does: the axial magnitudes along a random
  direction per head, the second half of the pairs at right angles to the first.

Class and register tokens, which have no place on the grid, come first in the sequence and are left
unrotated (``prefix_tokens``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from .._precision import KeepsPrecision
from .base import Checked, Placement, Rotary

__all__ = ["AxialRotaryEmbedding", "axial_frequencies", "grid_positions"]


def axial_frequencies(head_dim: int, axes: int = 2, base: float = 100.0) -> torch.Tensor:
    """RoPE-Axial frequencies (axes, 1, head_dim/2), float64: pairs [a*m, (a+1)*m) of axis a turn with
    base^(-2 * axes * j / head_dim), j = 0 .. m-1, m = head_dim / (2 * axes); zero elsewhere."""
    axes = _checks.positive_int("axes", axes, size=True)
    head_dim = _checks.even_int("head_dim", head_dim)
    if head_dim % (2 * axes):
        raise ValueError(
            f"head_dim must be a multiple of 2 * axes = {2 * axes} for axial RoPE, got {head_dim}"
        )
    base = _checks.positive_float("base", base)
    per_axis = head_dim // (2 * axes)
    block = base ** (-2.0 * axes * torch.arange(per_axis, dtype=torch.float64) / head_dim)
    freqs = torch.zeros(axes, 1, head_dim // 2, dtype=torch.float64)
    for a in range(axes):
        freqs[a, 0, a * per_axis : (a + 1) * per_axis] = block
    return freqs


def _mixed_init(head_dim: int, heads: int, base: float, generator) -> torch.Tensor:
    """RoPE-Mixed's initial frequencies (2, heads, head_dim/2): magnitudes base^(-4j/head_dim) along
    angle phi_h (first half of the pairs) and phi_h + pi/2 (second half), phi_h uniform in [0, 2 pi)."""
    magnitude = base ** (-4.0 * torch.arange(head_dim // 4, dtype=torch.float64) / head_dim)
    phi = torch.rand(heads, 1, generator=generator, dtype=torch.float64) * 2 * math.pi
    x = torch.cat((magnitude * torch.cos(phi), magnitude * torch.cos(phi + math.pi / 2)), dim=-1)
    y = torch.cat((magnitude * torch.sin(phi), magnitude * torch.sin(phi + math.pi / 2)), dim=-1)
    return torch.stack((x, y))


def grid_positions(*sizes: int, device=None) -> torch.Tensor:
    """Coordinates of a row-major grid of the given sizes: (prod(sizes), len(sizes)) float32, the last
    axis fastest (for (H, W): (0, 0), (0, 1), ..., (H-1, W-1))."""
    for i, s in enumerate(sizes):
        _checks.positive_int(f"grid[{i}]", s, size=True)
    mesh = torch.meshgrid(*(torch.arange(s, device=device) for s in sizes), indexing="ij")
    return torch.stack([m.reshape(-1) for m in mesh], dim=-1).to(torch.float32)


class AxialRotaryEmbedding(KeepsPrecision, Rotary):
    """RoPE over a 2-D (or 3-D) grid of patches, axial or RoPE-Mixed (Heo et al. 2024).

    Args:
        head_dim: size of each head's query/key vector (a multiple of 2 * axes; of 4 for mixed).
        axes: 2 for images (row, column), 3 for video (frame, row, column).
        base: the frequency base (the paper uses 100 for axial and 10 for mixed).
        mixed: learnable per-head frequencies mixing the axes (RoPE-Mixed, 2-D only); ``num_heads`` needed.
        num_heads: heads of q and k (mixed only).
        layout: dimension pairing, "interleaved" (the paper's complex pairs) or "half".
        seed: for the random directions of RoPE-Mixed's initialisation.

    Shape:
        forward(q, k, grid=(H, W) or positions=(N, axes), prefix_tokens=0, *, k_positions=None) -> (q, k),
        with q, k (batch, heads, prefix_tokens + N, head_dim); the first prefix_tokens tokens are not
        rotated; k_positions (N_k, axes) places keys elsewhere. rotate(x, positions=None, *, grid=None,
        prefix_tokens=0) -> x, one tensor. The dispatch is :class:`~.base.Rotary`'s: this class gives its
        :meth:`tables` and places its grid (:meth:`place`). It implements
        :class:`~.protocol.RotaryProtocol`.
    """

    precise_buffers = ("freqs",)

    def __init__(
        self,
        head_dim: int,
        axes: int = 2,
        base: float = 100.0,
        mixed: bool = False,
        num_heads: int | None = None,
        layout: str = "interleaved",
        seed: int = 0,
    ):
        super().__init__()
        head_dim, axes, mixed = (
            _checks.even_int("head_dim", head_dim),
            _checks.plain(axes),
            _checks.boolean("mixed", mixed),
        )
        if isinstance(axes, bool) or axes not in (2, 3):
            raise ValueError(f"axes must be 2 (images) or 3 (video), got {axes!r}")
        if num_heads is not None:
            num_heads = _checks.positive_int("num_heads", num_heads, size=True)
        seed = _checks.non_negative_int("seed", seed)
        if seed >= 1 << 64:
            raise ValueError(
                f"seed must be an integer in [0, 2^64 - 1] (a torch generator's seed), got {seed}"
            )
        self.head_dim, self.axes, self.mixed = head_dim, axes, mixed
        self.layout = _checks.layout(layout)
        if mixed:
            if num_heads is None:
                raise ValueError("mixed=True (RoPE-Mixed, frequencies per head) needs num_heads, got None")
            if axes != 2:
                raise ValueError(f"mixed (RoPE-Mixed) is defined for 2 axes, got axes={axes}")
            if head_dim % 4:
                raise ValueError(f"head_dim must be a multiple of 4 for RoPE-Mixed, got {head_dim}")
            heads = _checks.positive_int("num_heads", num_heads)
            init = _mixed_init(
                head_dim, heads, _checks.positive_float("base", base), torch.Generator().manual_seed(seed)
            )
            self.freqs = nn.Parameter(init.float())
        else:
            self.register_buffer("freqs", axial_frequencies(head_dim, axes, base).float(), persistent=False)
            self._freqs64 = axial_frequencies(head_dim, axes, base)

    def cos_sin(self, positions: torch.Tensor, prefix_tokens: int = 0, dtype=torch.float32):
        """cos and sin (heads or 1, prefix_tokens + N, head_dim/2) of positions (N, axes); prefix rows
        are cos 1, sin 0. Differentiable in the frequencies for RoPE-Mixed."""
        if self.mixed:
            theta = torch.einsum("na,ahk->hnk", positions.to(self.freqs.dtype), self.freqs)
        else:  # fixed frequencies: float64 angles, as everywhere in posenc
            theta = torch.einsum(
                "na,ahk->hnk", positions.to(torch.float64), self._freqs64.to(positions.device)
            )
        cos, sin = torch.cos(theta), torch.sin(theta)
        if prefix_tokens:
            pad = (cos.shape[0], _checks.non_negative_int("prefix_tokens", prefix_tokens), cos.shape[-1])
            cos = torch.cat((torch.ones(pad, dtype=cos.dtype, device=cos.device), cos), dim=1)
            sin = torch.cat((torch.zeros(pad, dtype=sin.dtype, device=sin.device), sin), dim=1)
        return cos.to(dtype), sin.to(dtype)

    def tables(self, x, positions=None, offset: int = 0, *, kind="q", grid=None, prefix_tokens: int = 0):
        """cos/sin for x (batch, heads, prefix_tokens + N, head_dim) at its grid positions: ``grid`` sizes
        (row-major patches) or explicit ``positions`` (N, axes); (N', head_dim/2) shared by the heads, or
        (heads, N', head_dim/2) for RoPE-Mixed. Queries and keys (``kind``) rotate alike; ``offset`` has no
        meaning on a grid (a non-zero one is refused)."""
        _no_offset(offset)
        if isinstance(positions, Checked):  # placed by forward, which checked q and k
            positions = positions.positions
        else:
            positions = _coordinates(self.axes, grid, positions, x)
            self._check("x", x, positions, prefix_tokens)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(positions, prefix_tokens, dtype)
        if cos.shape[0] == 1:  # axial: one table for every head
            cos, sin = cos[0], sin[0]
        return cos, sin

    def place(self, q, k, positions, k_positions, offset, options: dict) -> Placement:
        """q at their grid positions (``grid`` sizes or ``positions`` (N, axes)) after ``prefix_tokens``
        unrotated tokens, k at the same or at ``k_positions`` (N_k, axes), after their own prefix tokens.
        ``offset`` (of 1-D RoPE's default positions) has no meaning on a grid: a non-zero one is refused."""
        _no_offset(offset)
        options = dict(options)
        positions = _coordinates(self.axes, options.pop("grid", None), positions, q)
        prefix_tokens = options.get("prefix_tokens", 0)
        self._check("q", q, positions, prefix_tokens)
        if k_positions is None:
            self._check("k", k, positions, prefix_tokens)
            placed = Checked(positions)
            return Placement(placed, 0, placed, 0, options)
        k_positions = _coordinates(self.axes, None, k_positions, k, "k_positions")
        self._check("k", k, k_positions, prefix_tokens)
        return Placement(Checked(positions), 0, Checked(k_positions), 0, options)

    def forward(
        self, q, k, grid=None, positions=None, prefix_tokens: int = 0, *, k_positions=None, offset: int = 0
    ):
        """Rotate q and k (batch, heads, prefix_tokens + N, head_dim) by their grid positions: ``grid``
        sizes (row-major patches) or explicit ``positions`` (N, axes), e.g. rescaled coordinates. Keys at
        other coordinates than the queries (cross-attention, a cache of patches) take ``k_positions``
        (N_k, axes), after their own prefix_tokens. Only the signature is this class's own (the grid
        comes first): the dispatch is :meth:`Rotary.forward`'s."""
        return super().forward(
            q, k, positions, offset, k_positions=k_positions, grid=grid, prefix_tokens=prefix_tokens
        )

    def _check(self, name: str, x, positions, prefix_tokens: int) -> None:
        _checks.tensor_rank(name, x, 3)
        prefix_tokens = _checks.non_negative_int("prefix_tokens", prefix_tokens)
        if x.shape[-1] != self.head_dim or x.shape[-2] != prefix_tokens + positions.shape[0]:
            raise ValueError(
                f"{name} must have shape (..., prefix_tokens + N = {prefix_tokens + positions.shape[0]}, "
                f"head_dim = {self.head_dim}), got {tuple(x.shape)}"
            )
        if self.mixed and (x.dim() < 3 or x.shape[-3] != self.freqs.shape[1]):
            raise ValueError(
                f"RoPE-Mixed rotates with each head's own frequencies: {name} must have num_heads="
                f"{self.freqs.shape[1]} heads (batch, heads, tokens, head_dim), got {tuple(x.shape)}; "
                "with fewer key/value heads, repeat them to the query heads first"
            )

    def extra_repr(self) -> str:
        kind = "mixed" if self.mixed else "axial"
        return f"head_dim={self.head_dim}, axes={self.axes}, {kind}, layout={self.layout!r}"


def _coordinates(axes: int, grid, positions, q, name: str = "positions") -> torch.Tensor:
    """Grid coordinates (N, axes) on q's device: those of the row-major ``grid`` of patches, or ``positions``
    checked (``name``: the argument they came as)."""
    if (grid is None) == (positions is None):
        raise ValueError("give exactly one of grid (the patch grid's sizes) and positions (N, axes)")
    if grid is not None:
        if len(grid) != axes:
            raise ValueError(f"grid must give {axes} sizes, got {tuple(grid)}")
        return grid_positions(*grid, device=q.device)
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.shape[1] != axes:
        got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"{name} must be a tensor (N, {axes}), got {got}")
    if positions.dtype in _checks.NOT_POSITIONS or positions.is_complex():
        raise ValueError(
            f"{name} must have a signed integer or floating dtype (grid coordinates), got {positions.dtype}"
        )
    if _checks.can_read(positions) and positions.numel():
        far = float(positions.abs().amax())
        if not math.isfinite(far) or far > _checks.MAX_POSITION:
            raise ValueError(
                f"{name} must be finite coordinates of magnitude <= 2^53 (angles are formed in float64), "
                f"got largest magnitude {far}"
            )
    return positions.to(q.device)


def _no_offset(offset) -> None:
    if offset:
        raise ValueError(
            f"offset={offset!r} is not used with AxialRotaryEmbedding: give grid= or positions= (and "
            "k_positions=) instead"
        )
