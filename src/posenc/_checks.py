"""Argument checks shared by the core modules.

Every public entry point validates its arguments here first, so that a bad value fails at once with
a message naming the argument, the value and what is allowed, instead of deep inside torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

LAYOUTS = ("interleaved", "half")


class PositionError(IndexError):
    """A position lies outside what an encoding can represent (a learned table past its end)."""


def tracing() -> bool:
    """True while torch.compile or torch.export traces: checks that read tensor values are skipped there."""
    return torch.compiler.is_compiling()


def can_read(t: torch.Tensor) -> bool:
    """Whether checking t's values is free: a CPU tensor outside tracing. On an accelerator reading a value
    waits for the device (a host-device sync per call), which no forward path may do."""
    return t.device.type == "cpu" and not tracing()


_INT = (int, torch.SymInt)


def plain(value):
    """A numpy scalar or one-element tensor as the Python number it holds; anything else unchanged."""
    if isinstance(value, (int, float, torch.SymInt, torch.SymFloat)):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    if hasattr(value, "dtype") and hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()  # numpy scalar
    return value


def number(name: str, value, *, minimum: float | None = None, strict: bool = False, integer: bool = False):
    """A finite int/float (an int when ``integer``), optionally >= (or > when ``strict``) ``minimum``."""
    value = plain(value)
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
        raise ValueError(f"{name} must be {'an integer' if integer else 'a finite number'}, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return value


# The largest size (a dimension, a head count, a table length) a constructor allocates for: larger ones are
# refused before any allocation, not handed to torch to fail (or to take all memory) there.
MAX_SIZE = 1 << 20


# The largest position, offset or distance (a window, a group size, a chunk): positions, angles and remapped
# positions are formed in float64, which holds every integer up to 2^53 exactly and no longer tells larger
# neighbours apart (int64 tensors would wrap past 2^63 instead).
MAX_POSITION = 1 << 53


def positive_int(name: str, value, minimum: int = 1, *, size: bool = False, position: bool = False) -> int:
    """``value`` as a Python int >= ``minimum`` (a numpy scalar or one-element tensor converted; callers use
    the returned value); with ``size``, also <= :data:`MAX_SIZE`; with ``position`` (a position, an offset,
    a distance), <= :data:`MAX_POSITION`."""
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, _INT) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if size and value > MAX_SIZE:
        raise ValueError(
            f"{name} must be an integer <= {MAX_SIZE} (it sizes the tensors this allocates), got {value!r}"
        )
    if position and value > MAX_POSITION:
        raise ValueError(
            f"{name} must be an integer in [{minimum}, 2^53 = {MAX_POSITION}] (positions are formed in "
            f"float64, exact up to 2^53), got {value!r}"
        )
    return value


def even_int(name: str, value, minimum: int = 2, *, size: bool = True) -> int:
    """An even size (dimensions rotated or encoded in pairs), <= :data:`MAX_SIZE` unless ``size`` is False."""
    value = positive_int(name, value, minimum, size=size)
    if value % 2:
        raise ValueError(f"{name} must be even (dimensions are rotated/encoded in pairs), got {value!r}")
    return value


def positive_float(name: str, value, *, maximum: float | None = None, why: str = "") -> float:
    """A finite number > 0 as a float; with ``maximum``, also <= it (``why``: what a larger one breaks)."""
    value = plain(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be a finite number in (0, {maximum:g}] ({why}), got {value!r}")
    return float(value)


def non_negative_int(name: str, value, *, position: bool = False) -> int:
    return positive_int(name, value, minimum=0, position=position)


def offset(value) -> int:
    """A start position (``offset=``): an integer in [0, :data:`MAX_POSITION`]."""
    return positive_int("offset", value, minimum=0, position=True)


# softmax(scale * q.k) with a larger scale overflows float32 scores (and float16 ones far sooner) to inf,
# and a row holding inf turns into NaN; attention scales are 1/sqrt(head_dim) or near it.
MAX_SCALE = 1e4


def scale(value) -> float:
    """An attention ``scale``: a finite number in (0, :data:`MAX_SCALE`]."""
    why = "it multiplies every score: larger ones overflow the scores to inf"
    return positive_float("scale", value, maximum=MAX_SCALE, why=why)


def boolean(name: str, value) -> bool:
    """A bool (numpy's and one-element bool tensors included), not a number or None standing for one."""
    value = plain(value)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def one_of(name: str, value, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value


def layout(value) -> str:
    return one_of("layout", value, LAYOUTS)


def tensor_rank(name: str, x, min_rank: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_rank:
        raise ValueError(f"{name} must have at least {min_rank} dimensions, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


NOT_POSITIONS = (torch.bool, torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def positions(value, seq_len: int, batch: int | None = None) -> torch.Tensor:
    """Check a positions tensor: shape ``(seq,)`` or ``(batch, seq)``, integer or floating, finite, >= 0.

    ``batch`` is the leading dimension of the tensor the positions apply to, or None if unknown.
    """
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"positions must be a torch.Tensor of shape (seq,) or (batch, seq), got {type(value).__name__}"
        )
    if value.dim() not in (1, 2) or value.shape[-1] != seq_len:
        raise ValueError(
            f"positions must have shape ({seq_len},) or (batch, {seq_len}) to match seq length {seq_len}, "
            f"got {tuple(value.shape)}"
        )
    if value.dim() == 2 and batch is not None and value.shape[0] not in (1, batch):
        raise ValueError(f"positions has batch size {value.shape[0]}, but the input's batch size is {batch}")
    return position_values(value)


def position_values(value: torch.Tensor, name: str = "positions") -> torch.Tensor:
    """A positions tensor of any shape: a signed integer or floating dtype, and on the CPU outside tracing
    values finite and in [0, :data:`MAX_POSITION`]."""
    if value.dtype in NOT_POSITIONS or value.is_complex():
        raise ValueError(
            f"{name} must have a signed integer or floating dtype, got {value.dtype} "
            "(bool and uint8 tensors index as masks in torch, not as positions, and torch's other unsigned "
            "dtypes lack most operations; use int64)"
        )
    if not can_read(value):
        return value  # values unchecked on accelerators and while tracing: see can_read
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite, got NaN or inf")
    if value.numel():
        low, high = (t.item() for t in value.aminmax())
        if low < 0:
            raise ValueError(f"{name} must be >= 0, got minimum {low}")
        if high > MAX_POSITION:
            raise ValueError(
                f"{name} must be <= 2^53 = {MAX_POSITION} (angles are formed in float64, exact up to "
                f"2^53), got maximum {high}"
            )
    return value
