"""Encodings added to the input embeddings: sinusoidal (Vaswani et al. 2017), learned (GPT-2), and none."""

from __future__ import annotations

import torch
from torch import nn

from . import _checks
from ._checks import PositionError

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
    at large offsets), kept as a float32 non-persistent buffer that grows on demand (up to 65,536 positions;
    farther rows are computed per call), and cast to the input's dtype when added.

    Args:
        d_model: embedding width, even.
        base: the constant 10000 of the paper.

    Shape:
        forward(x, offset=0): x (batch, seq, d_model) or (seq, d_model) -> same shape, positions offset .. offset+seq-1.
    """

    pe: torch.Tensor

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.d_model = _checks.even_int("d_model", d_model)
        self.base = _checks.positive_float("base", base)
        self.register_buffer("pe", torch.empty(0, d_model), persistent=False)

    def table(self, length: int, offset: int = 0, device=None) -> torch.Tensor:
        """The encoding of positions offset .. offset+length-1, shape (length, d_model), float32."""
        _checks.non_negative_int("offset", offset)
        device = self.pe.device if device is None else device
        end = offset + length
        if end > _CACHE_LIMIT:  # a table reaching far positions would take gigabytes: compute just these rows
            return self._encode(torch.arange(offset, end, device=device))
        if end > self.pe.shape[0] or self.pe.device != torch.device(device):
            self.pe = self._encode(torch.arange(max(end, 2 * self.pe.shape[0], 256), device=device))
        return self.pe[offset:end]

    def _encode(self, positions: torch.Tensor) -> torch.Tensor:
        """(n,) positions -> (n, d_model) float32, angles formed in float64."""
        k = torch.arange(0, self.d_model, 2, dtype=torch.float64, device=positions.device)
        angles = positions.to(torch.float64)[:, None] * self.base ** (-k / self.d_model)
        pe = torch.empty(len(positions), self.d_model, dtype=torch.float64, device=positions.device)
        pe[:, 0::2] = torch.sin(angles)
        pe[:, 1::2] = torch.cos(angles)
        return pe.to(torch.float32)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_input(x, self.d_model)
        return x + self.table(x.shape[-2], offset, x.device).to(x.dtype)

    def _apply(self, fn, recurse=True):
        # A model-wide .half() must not round the table; rebuild it in float32 on the new device.
        super()._apply(fn, recurse)
        self.pe = torch.empty(0, self.d_model, device=self.pe.device)
        return self

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}"


class LearnedEmbedding(nn.Module):
    """Adds a learned table of position embeddings (BERT, GPT-2): one trainable row per position.

    It cannot extrapolate: a position at or past ``max_len`` has no row and raises :class:`PositionError`.

    Args:
        max_len: number of positions in the table (M in the chapter).
        d_model: embedding width.
        init_std: standard deviation of the normal initialisation (GPT-2 uses 0.02).

    Shape:
        forward(x, offset=0): x (batch, seq, d_model) or (seq, d_model) -> same shape.
    """

    def __init__(self, max_len: int, d_model: int, init_std: float = 0.02):
        super().__init__()
        self.max_len = _checks.positive_int("max_len", max_len)
        self.d_model = _checks.positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * _checks.positive_float("init_std", init_std))

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_input(x, self.d_model)
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

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x
