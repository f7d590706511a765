"""Eval-time context extensions: each one function ``(Encoding, factor, train_len) -> Encoding``.

An extension changes how a trained model attends past its training length without changing a weight: it
returns a copy of the model's :class:`~posenc.lab.encodings.Encoding` with another rotary, a window or a
score scale, and those modifiers combine. Which extensions apply to a scheme is that scheme's fact (its
registry entry's ``extensions``); :func:`posenc.lab.encodings.eval_extension` applies one to a model for
the length of a block.
Adding one is one decorated function:

    @register_extension("mine")
    def _mine(enc: Encoding, factor: float, train_len: int) -> Encoding:
        return enc.scaled(...)

and its name in the ``extensions`` of the schemes it applies to.

The methods: pi, position interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595); ntk, NTK-aware base
scaling (bloc97 2023); dynamic, dynamic NTK (emozilla 2023); yarn, YaRN (Peng et al. 2023,
arxiv.org/abs/2309.00071); bca, blockwise causal attention, each query seeing its own block of half the
training length and the previous one (Sun et al. 2022, arxiv.org/abs/2212.10554, section 3.3: how xPos
is evaluated past its training length); temp, NoPE with a sharper softmax past the training length, scores
times log(n) / log(L) at length n and training length L (Wang et al. 2024, arxiv.org/abs/2404.12224, who
find NoPE's attention spreads out past L and tune one temperature; log-length scaling is Chiang & Cholak
2022, arxiv.org/abs/2202.12172).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import replace

import posenc
from posenc.extension import MethodNames, extension_scaling
from posenc.lab.encoding import Encoding
from posenc.lab.errors import LabError

__all__ = ["EXTENSIONS", "ROPE_EXTENSIONS", "register_extension", "rescaled_rotary"]

# RoPE's methods that the laboratory evaluates, by their short names: a view of posenc.extension.METHODS, so
# that a method registered there later (lab=True) is an extension of every RoPE model here too
ROPE_EXTENSIONS: Sequence[str] = MethodNames(lambda m: m.lab)

Extension = Callable[[Encoding, float, int], Encoding]


class _Extensions(MutableMapping):
    """name -> extension: RoPE's methods of the registry (:data:`ROPE_EXTENSIONS`, made on lookup), then the
    laboratory's own (:func:`register_extension`), which may also replace one of RoPE's."""

    def __init__(self):
        self._own: dict[str, Extension] = {}

    def __getitem__(self, name: str) -> Extension:
        if name in self._own:
            return self._own[name]
        if name in ROPE_EXTENSIONS:
            return _rope_method(name)
        raise KeyError(name)

    def __setitem__(self, name: str, fn: Extension) -> None:
        self._own[name] = fn

    def __delitem__(self, name: str) -> None:
        del self._own[name]

    def __iter__(self) -> Iterator[str]:
        return iter((*ROPE_EXTENSIONS, *(n for n in self._own if n not in ROPE_EXTENSIONS)))

    def __len__(self) -> int:
        return sum(1 for _ in self)


EXTENSIONS: MutableMapping[str, Extension] = _Extensions()


def register_extension(name: str):
    """Decorator adding ``fn(encoding, factor, train_len) -> Encoding`` to :data:`EXTENSIONS` as ``name``."""

    def wrap(fn: Extension) -> Extension:
        EXTENSIONS[name] = fn
        return fn

    return wrap


def rescaled_rotary(rotary, scaling: dict | None, train_len: int) -> posenc.RotaryEmbedding:
    """``rotary``'s RoPE (its head size, rotary dimension, base and layout) with the Hugging Face
    ``scaling`` dict, ``max_position_embeddings`` the training length (what dynamic NTK treats as the
    trained context); a LabError for a rotary that is not plain RoPE (xPos's decay would be lost)."""
    if type(rotary) is not posenc.RotaryEmbedding:
        raise LabError(
            "rope scaling rescales a posenc.RotaryEmbedding; this encoding's rotary is "
            f"{type(rotary).__name__ if rotary is not None else None}"
        )
    return posenc.RotaryEmbedding(
        rotary.head_dim,
        base=rotary.base,
        rotary_dim=rotary.rotary_dim,
        layout=rotary.layout,
        scaling=scaling,
        max_position_embeddings=train_len,
    )


def _rope_method(method: str) -> Extension:
    def extend(enc: Encoding, factor: float, train_len: int) -> Encoding:
        scaling = extension_scaling(method, factor, train_len)
        return replace(enc, rotary=rescaled_rotary(enc.rotary, scaling, train_len))

    extend.__name__ = extend.__qualname__ = f"rope_{method}"
    extend.__doc__ = f"RoPE with the {method!r} frequencies (:func:`posenc.extension.extension_scaling`)."
    return extend


@register_extension("bca")
def blockwise_causal(enc: Encoding, factor: float, train_len: int) -> Encoding:
    """Blocks of half the training length: a query sees its own block and the previous one, so between
    L/2 and L keys, never more than in training (Sun et al. 2022, section 3.3)."""
    return enc.narrowed(max(1, train_len // 2))


@register_extension("temp")
def log_length_temperature(enc: Encoding, factor: float, train_len: int) -> Encoding:
    """Scores times log(factor * L) / log(L) (Chiang & Cholak 2022; Wang et al. 2024 for NoPE)."""
    if train_len < 2:
        raise LabError(f"extension='temp' needs train_len >= 2 (log(L) > 0), got {train_len}")
    return enc.scaled(math.log(factor * train_len) / math.log(train_len))
