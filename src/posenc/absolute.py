"""Encodings added to the input embeddings: sinusoidal (Vaswani et al. 2017), learned (GPT-2), and none."""

from __future__ import annotations

import torch
from torch import nn

from . import _checks
from ._checks import PositionError
from .angles import angles, inverse_frequencies

__all__ = ["SinusoidalEncoding", "LearnedEmbedding", "NoPositionalEncoding"]

_CACHE_LIMIT = 1 << 16  # positions past this are computed per call instead of growing the table


def _check_input(x: torch.Tensor, d_model: int) -> None:
    _checks.tensor_rank("x", x, 2)
    if x.shape[-1] != d_model:
        raise ValueError(f"x must have last dimension d_model={d_model}, got shape {tuple(x.shape)}")


class SinusoidalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding of Vaswani et al. (2017), section 3.5, to its input.

    PE[p, 2k] = sin(p * omega_k), PE[p, 2k+1] = cos(p * omega_k), omega_k = base^(-2k/d_model).
    No parameters, defined at every position. The table is computed in float64 (so it stays accurate
    at large offsets), kept per device as float32 rows that grow on demand up to 65,536 positions (farther
    rows are computed per call), and cast to the input's dtype when added. It is not a buffer: never saved
    in a state_dict, never rounded by a model-wide ``.half()``.

    Args:
        d_model: embedding width, even.
        base: the constant 10000 of the paper.

    Shape:
        forward(x, offset=0, positions=None): x (batch, seq, d_model) or (seq, d_model) -> same shape, at
        positions offset .. offset+seq-1, or at ``positions`` (seq,) or (batch, seq), integer or fractional
        (randomized positions, Ruoss et al. 2023).
    """

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.d_model = _checks.even_int("d_model", d_model)
        self.base = _checks.positive_float("base", base)
        # rows 0..n-1 per device; a plain attribute, so no state_dict entry and no rounding by .half()
        self._cache: dict[torch.device, torch.Tensor] = {}

    def table(self, length: int, offset: int = 0, device=None) -> torch.Tensor:
        """The encoding of positions offset .. offset+length-1, shape (length, d_model), float32."""
        _checks.non_negative_int("length", length)
        _checks.non_negative_int("offset", offset)
        device = torch.device("cpu" if device is None else device)
        end = offset + length
        if end > _CACHE_LIMIT:  # a table reaching far positions would take gigabytes: compute just these rows
            return self._encode(torch.arange(offset, end, device=device))
        cached = self._cache.get(device)
        if _checks.tracing():  # read a memo an eager call made; never write one from inside a graph
            if cached is not None and end <= cached.shape[0]:
                return cached[offset:end]
            return self._encode(torch.arange(offset, end, device=device))
        if cached is None or cached.shape[0] < end:
            size = max(end, 2 * (0 if cached is None else cached.shape[0]), 256)
            cached = self._cache[device] = self._encode(torch.arange(size, device=device))
        return cached[offset:end]

    def cached_rows(self, device="cpu") -> int:
        """How many positions the memoised table on ``device`` holds."""
        cached = self._cache.get(torch.device(device))
        return 0 if cached is None else cached.shape[0]

    def _encode(self, positions: torch.Tensor) -> torch.Tensor:
        """(n,) positions -> (n, d_model) float32, angles formed in float64."""
        theta = angles(positions, inverse_frequencies(self.d_model, self.base))
        return torch.stack((torch.sin(theta), torch.cos(theta)), dim=-1).flatten(-2).to(torch.float32)

    def forward(
        self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        _check_input(x, self.d_model)
        if positions is not None:
            positions = _checks.positions(positions, x.shape[-2], x.shape[0] if x.dim() == 3 else None)
            return x + self._encode(positions.to(x.device)).to(x.dtype)
        return x + self.table(x.shape[-2], offset, x.device).to(x.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}"


class LearnedEmbedding(nn.Module):
    """Adds a learned table of position embeddings (BERT, GPT-2): one trainable row per position.

    It cannot extrapolate: a position at or past ``max_len`` has no row and raises :class:`PositionError`.

    Args:
        max_len: number of positions in the table (its largest position + 1).
        d_model: embedding width.
        init_std: standard deviation of the normal initialisation (GPT-2 uses 0.02).

    Shape:
        forward(x, offset=0, positions=None): x (batch, seq, d_model) or (seq, d_model) -> same shape, at
        positions offset .. offset+seq-1, or at integer ``positions`` (seq,) or (batch, seq).
    """

    def __init__(self, max_len: int, d_model: int, init_std: float = 0.02):
        super().__init__()
        self.max_len = _checks.positive_int("max_len", max_len, size=True)
        self.d_model = _checks.positive_int("d_model", d_model, size=True)
        self.weight = nn.Parameter(
            torch.randn(max_len, d_model)
            * _checks.positive_float("init_std", init_std, maximum=1e30, why="the table is float32")
        )

    def forward(
        self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        _check_input(x, self.d_model)
        if positions is not None:
            positions = _checks.positions(positions, x.shape[-2], x.shape[0] if x.dim() == 3 else None)
            if positions.is_floating_point():
                raise ValueError(
                    f"positions must be integers for a learned table, got dtype {positions.dtype}"
                )
            if _checks.can_read(positions) and positions.numel() and positions.max().item() >= self.max_len:
                raise PositionError(
                    f"position {positions.max().item()} is past the end of the learned position table "
                    f"(max_len={self.max_len}, positions 0..{self.max_len - 1})"
                )
            return x + self.weight[positions.to(x.device)].to(x.dtype)
        _checks.non_negative_int("offset", offset)
        end = offset + x.shape[-2]
        if end > self.max_len:
            raise PositionError(
                f"position {end - 1} is past the end of the learned position table (max_len={self.max_len}, "
                f"positions 0..{self.max_len - 1}): learned embeddings cannot extrapolate to unseen positions"
            )
        return x + self.weight[offset:end].to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


class NoPositionalEncoding(nn.Module):
    """No positional information at all (NoPE): returns its input. A baseline for the laboratory."""

    def forward(
        self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        return x
