"""posenc's compiled CPU op: RoPE in one vectorised pass (``rotary_cpu.cpp``), built by ``make install``.

:func:`available` says whether ``torch.ops.posenc.rotary`` can run in this process. The library is loaded
on the first call that could use it, never compiled here: ``python -m posenc.kernels.native.build`` (run by
``make install``) compiles it against the installed torch. A library built for another torch or another
version of the source is not loaded (the op is bound to torch's C++ ABI); posenc then runs its torch kernels
and says once, as a warning, how to build. ``POSENC_DISABLE_NATIVE=1`` turns the op off (the test suite
runs the rotary tests both ways).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings

import torch

__all__ = ["available", "disabled", "rotary", "status", "why_not_loadable"]

_HOW = "run `make install` in posenc's checkout, or `python -m posenc.kernels.native.build`"


def why_not_loadable() -> str | None:
    """None when the built library matches this torch and this source, else why it cannot be used."""
    from . import build

    if not build.LIBRARY.exists():
        return f"the compiled CPU op is not built ({_HOW})"
    stale = build.stale(build.RECORD)
    if stale:
        names = " and ".join("source" if key == "source_sha256" else key for key in stale)
        return f"the compiled CPU op was built for another {names} ({_HOW} to rebuild it)"
    return None


@functools.cache
def _load() -> str | None:
    """Load the library once; None when it is loaded, else why not."""
    from .build import LIBRARY

    why = why_not_loadable()
    if why is not None:
        return why
    try:
        torch.ops.load_library(str(LIBRARY))
    except (OSError, RuntimeError) as error:
        return f"the compiled CPU op did not load ({error}); {_HOW}"
    return None


def status() -> str:
    """One line: whether the op runs here, and if not, why."""
    if os.environ.get("POSENC_DISABLE_NATIVE") == "1":
        return "off (POSENC_DISABLE_NATIVE=1)"
    why = _load()
    return "loaded" if why is None else why


def available() -> bool:
    """Whether ``torch.ops.posenc.rotary`` runs in this process (built, current, not disabled)."""
    if os.environ.get("POSENC_DISABLE_NATIVE") == "1":
        return False
    why = _load()
    if why is not None:
        _warn_once(why)
    return why is None


@functools.cache
def _warn_once(why: str) -> None:
    warnings.warn(f"posenc: {why}; RoPE on the CPU runs on torch ops meanwhile", stacklevel=4)


@contextlib.contextmanager
def disabled():
    """Inside, posenc runs its torch kernels as if the op were not built (``POSENC_DISABLE_NATIVE=1``): to
    compare the two, or to rule the op out while hunting a difference."""
    saved = os.environ.get("POSENC_DISABLE_NATIVE")
    os.environ["POSENC_DISABLE_NATIVE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("POSENC_DISABLE_NATIVE", None)
        else:
            os.environ["POSENC_DISABLE_NATIVE"] = saved


def rotary(xs, outs, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, conjugate: bool) -> None:
    """Rotate every x of ``xs`` into the matching ``outs`` (x itself: in place) in one parallel region.

    xs: CPU tensors (..., seq, head_dim) with a unit last stride, float32/float64/bfloat16/float16;
    cos, sin: (..., seq, rotary_dim/2), float32 (float64 for float64 x), broadcastable against each x's
    leading dimensions; ``conjugate`` rotates by -theta. Arithmetic float32 (float64), one rounding.
    """
    _op()(xs, outs, cos, sin, interleaved, conjugate)


@functools.cache
def _op():
    why = _load()
    if why is not None:
        raise RuntimeError(f"posenc: {why}")
    # the overload itself: calling the packet resolves it again on every call (a microsecond or two)
    return torch.ops.posenc.rotary.default
