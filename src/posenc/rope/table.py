"""cos/sin tables for RoPE: theta = p * omega_k, attention factor included, read through one lookup.

A :class:`CosSinTable` answers "cos and sin at these positions" for one :class:`~.frequencies.Schedule`, and
:meth:`CosSinTable.lookup` is the only way to ask it:

* the schedule's frequencies at the original context (static methods, and length-dependent methods up
  to it) are memoised as float32 rows 0..n-1 per device, grown by doubling, up to ``CACHE_LIMIT``
  positions: a contiguous range of positions is a slice of them, integer positions a gather;
* anything else is formed afresh from float64 angles: fractional positions, positions past the cache
  limit (a table reaching position 10^7 would take gigabytes), float64 requests, and per-sequence
  schedules (a length-dependent method at another context length, or a per-sequence factor);
* while torch.compile traces, a run of positions is a slice of rows an eager call already made, or fresh
  angles: never a memo grown inside the graph.

The same rows laid out for the small decode kernel (:meth:`RowMemo.small_rows`) are another thing: not
cos and sin but the operands :func:`posenc.kernels.rotate_small` multiplies by.

The memo (:class:`RowMemo`, which :class:`CosSinTable` extends with the schedules and the lookup) is a
plain attribute, not a buffer: it never reaches a ``state_dict`` and a model-wide ``.half()`` cannot round
it.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..angles import angles
from .frequencies import Schedule

__all__ = ["CACHE_LIMIT", "CosSinTable", "align_to", "call_context", "cos_sin_of"]

CACHE_LIMIT = 1 << 16  # positions past this are computed per call instead of growing the cache


class RowMemo:
    """The memo of a :class:`CosSinTable`: float32 cos/sin rows 0..n-1 at the schedule's original context
    (``inv_freq64``, ``attention_factor``), per device, grown by doubling; and the same rows laid out for
    :func:`posenc.kernels.rotate_small`, per device and layout. Only ever grown, never past what a
    position below ``CACHE_LIMIT`` asks for."""

    inv_freq64: torch.Tensor
    attention_factor: float

    def __init__(self):
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._laid_out: dict[tuple[torch.device, str], tuple[torch.Tensor, ...]] = {}

    def _rows(self, end: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The memoised float32 table on ``device``, at least ``end`` rows long."""
        cached = self._cache.get(device)
        if cached is None or cached[0].shape[0] < end:
            size = max(end, 2 * (0 if cached is None else cached[0].shape[0]), 256)
            cached = cos_sin_of(
                torch.arange(size, device=device), self.inv_freq64, self.attention_factor, torch.float32
            )
            self._cache[device] = cached
        return cached

    def small_rows(self, start: int, stop: int, device, layout: str) -> tuple[torch.Tensor, ...]:
        """Rows start..stop-1 laid out for :func:`posenc.kernels.rotate_small`, memoised per device:

        * "half": (cos2, sin2), each (rows, rotary_dim) float32: cos for both members of a pair, sin signed
          (-sin for the first member, +sin for the second), so rotate(x) = x * cos2 + swap_halves(x) * sin2;
        * "interleaved": (cos + i sin,), (rows, rotary_dim/2) complex64: the pairs of x are complex numbers.
        """
        if stop > CACHE_LIMIT:  # far positions: fresh rows, never a memo sized by a position
            positions = torch.arange(start, stop, device=device)
            return _lay_out(
                *cos_sin_of(positions, self.inv_freq64, self.attention_factor, torch.float32), layout
            )
        laid = self._laid_out.get((device, layout))
        if laid is None or laid[0].shape[0] < stop:  # rows are fixed per position: only ever grow
            laid = _lay_out(*self._rows(stop, device), layout)
            self._laid_out[(device, layout)] = laid
        return laid[0][start:stop], *(t[start:stop] for t in laid[1:])

    def cached_rows(self, device="cpu") -> int:
        """How many positions the memoised table on ``device`` holds (0 before the first lookup)."""
        cached = self._cache.get(torch.device(device))
        return 0 if cached is None else cached[0].shape[0]


class CosSinTable(RowMemo):
    """cos/sin of one RoPE schedule. Shapes: (seq, rotary_dim/2), or (batch, seq, rotary_dim/2) when the
    positions are (batch, seq) or a per-sequence schedule is asked for."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        inv, attn = schedule.at()
        self.inv_freq64: torch.Tensor = inv  # (rotary_dim/2,) float64, at the original context
        self.attention_factor: float = float(attn)
        # The same numbers as Python floats: a traced call builds its constant from them, so its size is
        # static (a tensor attribute would get a symbolic size under dynamic=True, shared with any equal dim).
        self._inv_freq_values = tuple(inv.tolist())
        RowMemo.__init__(self)

    # ------------------------------------------------------------------ schedules
    def frequencies(self, context_len=None, factor=None):
        """float64 inverse frequencies and attention factor for a context length and/or scaling factor.

        Args:
            context_len: the sequence length length-dependent methods scale for (an int, or a (batch,) tensor
                with one length per sequence); None: the original context. Ignored by static methods.
            factor: overrides the scaling dict's ``factor`` (a number or a (batch,) tensor, one per sequence),
                for methods that have one (linear, ntk, dynamic, yarn, llama3, proportional).

        Returns:
            inv_freq (rotary_dim/2,) and a float, or, when either argument is a (batch,) tensor, inv_freq
            (batch, rotary_dim/2) and attention factors (batch,) float64.
        """
        _check_per_sequence("context_len", context_len, minimum=1, integer=True)
        _check_per_sequence("factor", factor, minimum=1.0, integer=False)
        if factor is not None and self.schedule.method == "default":
            raise ValueError(
                "factor needs a scaling method (RotaryEmbedding(..., scaling={...})), got scaling=None"
            )
        lengths, factors = _per_sequence(context_len), _per_sequence(factor)
        if lengths is None and factors is None:
            return self._one(_scalar(context_len), _scalar(factor))
        return _stacked(self._one, lengths, factors, context_len, factor)

    def _one(self, context_len, factor):
        if factor is None and (context_len is None or not self.schedule.length_dependent):
            return self.inv_freq64, self.attention_factor
        return self.schedule.at(context_len if self.schedule.length_dependent else None, factor)

    # ------------------------------------------------------------------ lookup
    def lookup(
        self,
        positions: torch.Tensor | None = None,
        offset=0,
        *,
        length=None,
        device=None,
        dtype: torch.dtype = torch.float32,
        context_len=None,
        factor=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at ``positions`` + ``offset``: every read of the table goes through here.

        Args:
            positions: a tensor (seq,) or (batch, seq), integer or fractional, checked by the caller (moved
                to ``device`` when one is given); None: the run offset .. offset+length-1 (on ``device``,
                the CPU when None; ``offset`` and ``length`` may be symbolic while torch.compile traces).
            dtype: the tables' dtype (float32; float64 for float64 inputs).
            context_len, factor: the schedule, see :meth:`frequencies`; for a length-dependent method the
                context defaults to 1 + the largest position, per sequence for (batch, seq) positions, so a
                sequence's rotation never depends on what else is in the batch.

        Returns:
            cos, sin: (seq, rotary_dim/2), or (batch, seq, rotary_dim/2) for (batch, seq) positions or a
            per-sequence schedule. A run is a slice of the memoised rows and integer positions a gather of
            them; fractional or far positions, float64 tables and other schedules are fresh float64 angles.
        """
        _checks.offset(offset)
        traced = _checks.tracing()
        if positions is None:
            if traced and context_len is None and factor is None and not self.schedule.length_dependent:
                return self._traced_run(offset, length, device, dtype)  # start and length stay symbolic
            if traced:
                positions = torch.arange(offset, offset + length, device=device)
            else:  # a range: its end is known without reading a tensor
                positions = range(offset, offset + length)
                device = torch.device("cpu") if device is None else torch.device(device)
        else:
            positions = positions if device is None else positions.to(device)
            positions = positions + offset if offset else positions
        if not isinstance(positions, range):
            device = positions.device
        _check_per_sequence("context_len", context_len, minimum=1, integer=True)
        scaled = factor is not None or (self.schedule.length_dependent and context_len is not None)
        if self.schedule.length_dependent and context_len is None:
            context_len = default_context(positions)
            scaled = True
        if scaled:
            inv, attn = self.frequencies(context_len, factor)
            return cos_sin_of(_as_tensor(positions, device), inv, attn, dtype)
        if traced:  # fresh angles are pure ops the compiler can fuse; a memo would be a side effect
            inv = torch.tensor(self._inv_freq_values, dtype=torch.float64, device=device)
            return cos_sin_of(_as_tensor(positions, device), inv, self.attention_factor, dtype)
        end = _end(positions)
        if dtype == torch.float64 or end > CACHE_LIMIT:
            return cos_sin_of(_as_tensor(positions, device), self.inv_freq64, self.attention_factor, dtype)
        cos, sin = self._rows(end, device)
        if isinstance(positions, range):
            return cos[positions.start : positions.stop], sin[positions.start : positions.stop]
        return cos[positions], sin[positions]

    def _traced_run(self, start, length, device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of positions start .. start+length-1 while torch.compile traces (start and length may be
        symbolic): a slice of the memoised rows when an eager call already made enough of them (the
        compiled graph then reads them like a weight), else fresh angles. Never the memo under
        torch.export, whose program must hold for every length it allows."""
        cached = self._cache.get(torch.device(device))
        usable = cached is not None and dtype == torch.float32 and not torch.compiler.is_exporting()
        if usable and start + length <= cached[0].shape[0]:
            return cached[0][start : start + length], cached[1][start : start + length]
        inv = torch.tensor(self._inv_freq_values, dtype=torch.float64, device=device)
        positions = torch.arange(start, start + length, device=device)
        return cos_sin_of(positions, inv, self.attention_factor, dtype)


def _end(positions) -> int:
    """1 + the largest position the memoised rows must hold; past ``CACHE_LIMIT`` for positions that are
    fractional or whose largest one could only be read by syncing with the device (fresh angles then)."""
    if isinstance(positions, range):
        return positions.stop
    if _checks.can_read(positions) and not positions.is_floating_point():
        return int(positions.max()) + 1 if positions.numel() else 0
    return CACHE_LIMIT + 1


def _lay_out(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """Rows of cos/sin as :meth:`CosSinTable.small_rows` hands them out for ``layout``."""
    if layout == "half":
        return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
    return (torch.complex(cos, sin),)


def align_to(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, what: str = "positions"):
    """Shape per-sequence tables (batch, seq, r/2) to broadcast against x (batch, ..., seq, head_dim):
    batch lines up with x's first axis and the tables broadcast over the axes between (heads)."""
    if cos.dim() != 3:
        return cos, sin
    if x.dim() < 3 or cos.shape[0] not in (1, x.shape[0]):
        raise ValueError(
            f"{what} give {cos.shape[0]} per-sequence schedules, which do not match x of shape "
            f"{tuple(x.shape)}"
        )
    shape = (cos.shape[0],) + (1,) * (x.dim() - 3) + cos.shape[1:]
    return cos.reshape(shape), sin.reshape(shape)


def cos_sin_of(positions: torch.Tensor, inv, attn, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of float64 angles, times the attention factor (a float or (batch,) tensor), cast to
    dtype."""
    theta = angles(positions, inv)
    cos, sin = torch.cos(theta), torch.sin(theta)
    if isinstance(attn, torch.Tensor):
        a = attn.to(device=cos.device, dtype=torch.float64)[:, None, None]
        cos, sin = cos * a, sin * a
    elif attn != 1.0:
        cos, sin = cos * attn, sin * attn
    return cos.to(dtype), sin.to(dtype)


def _as_tensor(positions, device) -> torch.Tensor:
    if isinstance(positions, range):
        return torch.arange(positions.start, positions.stop, device=device)
    return positions


def call_context(positions: torch.Tensor) -> int:
    """1 + the largest position of a whole call, every sequence and every axis (1 for none): the length
    transformers takes for a length-dependent schedule (``torch.max(position_ids) + 1``)."""
    return int(positions.max()) + 1 if positions.numel() else 1


def default_context(positions):
    """1 + the largest position: an int, or a (batch,) tensor for (batch, seq) positions."""
    if isinstance(positions, range):
        return max(positions.stop, 1)
    if positions.dim() == 2:
        return positions.amax(-1).floor().long() + 1
    return int(positions.max().floor()) + 1 if positions.numel() else 1


def _stacked(one, lengths, factors, length, factor):
    """(batch, r/2) inverse frequencies and (batch,) attention factors, one schedule per sequence."""
    n = len(lengths if lengths is not None else factors)
    lengths = lengths or [_scalar(length)] * n
    factors = factors or [_scalar(factor)] * n
    if len(lengths) != len(factors):
        raise ValueError(
            f"context_len and factor must give one value per sequence each, got {len(lengths)} and "
            f"{len(factors)}"
        )
    memo: dict = {}  # sequences in a batch often share a length
    for key in zip(lengths, factors, strict=True):
        if key not in memo:
            memo[key] = one(*key)
    rows = [memo[key] for key in zip(lengths, factors, strict=True)]
    inv = torch.stack([r[0] for r in rows])
    attn = torch.tensor([float(r[1]) for r in rows], dtype=torch.float64)
    return inv, attn


def _check_per_sequence(name: str, value, *, minimum, integer: bool) -> None:
    """A number or a (batch,) tensor of them, each >= minimum (CPU values only: reading others would sync)."""
    if value is None:
        return
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        if value.dim() != 1:
            raise ValueError(f"{name} must be a number or a (batch,) tensor, got shape {tuple(value.shape)}")
        if _checks.can_read(value) and value.numel() and bool((value < minimum).any()):
            raise ValueError(f"{name} must be >= {minimum} for every sequence, got {value.tolist()}")
        return
    _checks.number(name, value, minimum=minimum, integer=integer)


def _per_sequence(value) -> list | None:
    """A (batch,) tensor as a list of Python numbers; None for scalars and None."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.tolist()
    return None


def _scalar(value):
    return value.item() if isinstance(value, torch.Tensor) else value
