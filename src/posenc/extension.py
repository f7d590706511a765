"""Context-extension methods: the one registry. A method extends a RoPE model trained at N tokens to a factor
s more, either by its frequencies (a Hugging Face scaling dict that :class:`posenc.RotaryEmbedding` and
transformers read), training-free by remapping distances in attention (a :class:`posenc.remap.Remap`), or by
converting layers: taking RoPE away from a model's global layers, as SWAN-GPT's NoPE global layers
(Puvvada et al. 2025, arXiv:2504.08719), with or without a log-length query temperature.

Every other place that names a method is a view of :data:`METHODS`: ``posenc extend``'s methods and help,
the laboratory's eval-time extensions, ``posenc plot frequencies``, ``posenc zoo --scaling``. A new method is
one :class:`ExtensionMethod` here (register it with :func:`register`), and all of them see it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from . import _checks
from .remap import STRING, DualChunk, Remap, ReRoPE, SelfExtend

__all__ = ["METHODS", "TRAINED", "ExtensionMethod", "MethodNames", "extension_scaling", "get", "register"]

# In a method's ``scaling_keys``: the trained length N (``original_max_position_embeddings``).
TRAINED = "trained length"


@dataclass(frozen=True)
class ExtensionMethod:
    """One context-extension method.

    Args:
        name: its short name (``posenc extend --methods``, the lab's ``rope~name`` rows).
        title: a label for figures and tables.
        summary: what it does at the settings posenc uses, with its source (help texts, docs).
        rope_type: for a frequency method, the Hugging Face ``rope_type`` its scaling dict names.
        scaling_keys: the dict's other keys with their published defaults (:data:`TRAINED`: N).
        remap: for a training-free method, ``(train_len, longest) -> Remap``: its remap for a model trained at
            N tokens run at up to ``longest``; a ValueError naming the argument where it cannot work.
        identity_at_one: at factor 1 the method is, by its definition, the unscaled RoPE (so it is built as
            such: its frequencies are then the plain ones bit for bit).
        lab: the laboratory evaluates it as an eval-time extension of every RoPE model.
        length_dependent: its frequencies change with the sequence length (dynamic NTK).
        without_rope: a layer conversion: the layers it applies to lose RoPE (their queries and keys are no
            longer rotated); ``layers`` names them.
        query_temperature: with ``without_rope``, those layers' queries are also scaled by
            max(1, ln(p + 1) / ln N) at position p (the log-length scaling of attention scores that keeps
            their entropy from growing with the length: Chiang & Cholak 2022, arXiv:2202.12172; SWAN-GPT's
            dynamic scaling of its NoPE layers).
        layers: the layers a method applies to by default (``global``, ``sliding``, ``all``, ``every:K``,
            ``i,j,k``: :mod:`posenc.real.layers`); None: those the caller's default gives.
    """

    name: str
    title: str
    summary: str
    rope_type: str | None = None
    scaling_keys: Mapping[str, object] = field(default_factory=dict)
    remap: Callable[[int, int], Remap] | None = None
    identity_at_one: bool = False
    lab: bool = False
    length_dependent: bool = False
    without_rope: bool = False
    query_temperature: bool = False
    layers: str | None = None

    @property
    def kind(self) -> str:
        """ "frequencies", "remap" or "layers" (a layer conversion)."""
        if self.rope_type is not None:
            return "frequencies"
        return "remap" if self.remap is not None else "layers"

    def scaling(self, factor: float, train_len: int) -> dict:
        """The Hugging Face scaling dict that extends a model trained at ``train_len`` tokens by ``factor``;
        :func:`posenc.rope.frequencies.resolve_schedule` validates it when it is used."""
        if self.rope_type is None:
            what = "remaps distances in attention" if self.remap else "converts layers"
            raise ValueError(f"{self.name} {what}: it has no RoPE scaling")
        extra = {k: train_len if v == TRAINED else v for k, v in self.scaling_keys.items()}
        return {"rope_type": self.rope_type, "factor": factor, **extra}

    def remap_for(self, train_len: int, longest: int) -> Remap:
        """This training-free method's remap for a model trained at ``train_len`` run at up to ``longest``."""
        if self.remap is None:
            raise ValueError(f"{self.name} changes RoPE's frequencies: it remaps no distance")
        train_len = _checks.positive_int("train_len", train_len, position=True)
        longest = _checks.positive_int("longest", longest, position=True)
        return self.remap(train_len, longest)


METHODS: dict[str, ExtensionMethod] = {}
"""Every method by its short name, in the order tables list them."""


class MethodNames(Sequence):
    """The names of the registered methods that ``keep(method)`` selects, read from :data:`METHODS` on every
    use: a view, so that a method registered after import (a user's own) is in it too.

    ``MethodNames(lambda m: m.lab)`` is the laboratory's methods; it compares equal to the tuple of its
    current names."""

    def __init__(self, keep: Callable[[ExtensionMethod], bool]):
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(name for name, method in METHODS.items() if self._keep(method))

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name) -> bool:
        return name in METHODS and self._keep(METHODS[name])

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return f"MethodNames{self._names()!r}"


def register(method: ExtensionMethod) -> ExtensionMethod:
    """Add ``method`` to :data:`METHODS`; a ValueError if its name is taken (or is "none", the model as
    trained)."""
    if method.name in METHODS or method.name == "none":
        raise ValueError(f"an extension method named {method.name!r} exists already")
    given = [method.rope_type is not None, method.remap is not None, method.without_rope]
    if sum(given) != 1:
        raise ValueError(
            f"{method.name}: give exactly one of rope_type (frequencies), remap (distances) or without_rope "
            "(a layer conversion)"
        )
    if method.query_temperature and not method.without_rope:
        raise ValueError(f"{method.name}: query_temperature is for a layer conversion (without_rope=True)")
    METHODS[method.name] = method
    return method


def get(name: str) -> ExtensionMethod:
    """The method named ``name``; a ValueError listing every name otherwise."""
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {name!r}")
    return METHODS[name]


def extension_scaling(method: str, factor: float, original_length: int) -> dict:
    """The scaling dict of frequency method ``method`` (a name in :data:`METHODS`) that extends a RoPE model
    trained at ``original_length`` tokens by ``factor``, with its published defaults. For "dynamic" give
    the model's ``max_position_embeddings=original_length`` to the :class:`~posenc.RotaryEmbedding` too: it
    scales past that. A ValueError naming the method if it is unknown or remaps distances instead."""
    found = get(method)
    if found.rope_type is None:
        frequency = [n for n, m in METHODS.items() if m.rope_type is not None]
        raise ValueError(
            f"method must be one of {', '.join(map(repr, frequency))} (the frequency methods); got "
            f"{method!r}, which {'remaps distances' if found.remap else 'converts layers'}"
        )
    return found.scaling(factor, original_length)


# ------------------------------------------------------------------------------------ the remaps' settings


def _neighbour_window(train_len: int) -> int:
    return max(1, train_len // 4)


def _selfextend(train_len: int, longest: int) -> Remap:
    # f(d) = d // g + W - W // g >= (d - W + 1) / g + W - 1, so no g below (d - W + 1) / (N - W) keeps
    # d = longest - 1 inside N: start the search there, not at 1 (a few steps whatever the length)
    window = _neighbour_window(train_len)
    far, room = longest - 1, max(1, train_len - window)
    group = max(1, -(-(far - window + 1) // room) - 1)
    while SelfExtend(group, window).distance(far) > train_len - 1 and group < longest:
        group += 1
    return SelfExtend(group, window)


def _leaky_rerope(train_len: int, longest: int) -> Remap:
    window = _neighbour_window(train_len)
    slope = (longest - 1 - window) / max(1, train_len - 1 - window)
    return ReRoPE(window, leaky=max(1.01, math.ceil(slope * 100) / 100))


# STRING's released setting: the shift at 0.33 N and a local window of 128 tokens for N >= 2048; below,
# the window keeps that proportion, N / 16, so that it stays below the shift (equal, STRING is the identity).
STRING_SHIFT, STRING_WINDOW, STRING_WINDOW_FROM = 0.33, 128, 2048


def _string_local(train_len: int) -> int:
    return STRING_WINDOW if train_len >= STRING_WINDOW_FROM else max(1, train_len // 16)


# the shortest trained length at which STRING's shift lies above its window (int(0.33 * 7) = 2 > 1)
_STRING_SHORTEST = next(n for n in range(1, STRING_WINDOW_FROM) if int(STRING_SHIFT * n) > _string_local(n))


def _string(train_len: int, longest: int) -> Remap:
    shift, local = int(STRING_SHIFT * train_len), _string_local(train_len)
    if local >= shift:
        raise ValueError(
            f"--methods string: at --train-len {train_len} STRING's shift ({shift}, 0.33 N) is not above its "
            f"local window ({local}), so it would remap no distance; it needs a trained length of at least "
            f"{_STRING_SHORTEST}"
        )
    return STRING(shift, local, attention_factor=0.1 * math.log(2) + 1)


# ------------------------------------------------------------------------------------------- the methods

for _method in (
    ExtensionMethod(
        "pi",
        "PI (linear)",
        "position interpolation, each frequency divided by the factor (Chen et al. 2023, arXiv:2306.15595)",
        rope_type="linear",
        identity_at_one=True,
        lab=True,
    ),
    ExtensionMethod(
        "ntk",
        "NTK-aware",
        "static NTK-aware scaling, base times factor^(d/(d-2)) (bloc97 2023)",
        rope_type="ntk",
        identity_at_one=True,
        lab=True,
    ),
    ExtensionMethod(
        "dynamic",
        "dynamic NTK",
        "dynamic NTK, the NTK base recomputed from the sequence length past the trained length "
        "(emozilla 2023)",
        rope_type="dynamic",
        lab=True,
        length_dependent=True,  # at factor 1 it still grows its base past N: not the identity
    ),
    ExtensionMethod(
        "yarn",
        "YaRN",
        "YaRN, interpolation ramped by frequency plus an attention temperature (Peng et al. 2023, "
        "arXiv:2309.00071)",
        rope_type="yarn",
        # YaRN picks which frequencies to interpolate by how many turns they make within the original context
        scaling_keys={"original_max_position_embeddings": TRAINED},
        identity_at_one=True,  # the ramp interpolates by 1 and its temperature 0.1 ln 1 + 1 is 1
        lab=True,
    ),
    ExtensionMethod(
        "llama3",
        "Llama 3.1",
        "Llama 3.1's scaling by wavelength band, low/high frequency factors 1 and 4 (Meta 2024, "
        "arXiv:2407.21783)",
        rope_type="llama3",
        # Meta's released configs
        scaling_keys={
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": TRAINED,
        },
        identity_at_one=True,
    ),
    ExtensionMethod(
        "nope-global",
        "NoPE global",
        "the global (full-attention) layers without RoPE, the sliding-window layers as trained: SWAN-GPT's "
        "layout reached without training (Puvvada et al. 2025, arXiv:2504.08719)",
        without_rope=True,
        layers="global",
    ),
    ExtensionMethod(
        "nope-global-temp",
        "NoPE global + temperature",
        "nope-global with each global layer's queries scaled by max(1, ln(p + 1) / ln N): the log-length "
        "scaling SWAN-GPT applies to its NoPE layers at inference (Puvvada et al. 2025, arXiv:2504.08719)",
        without_rope=True,
        query_temperature=True,
        layers="global",
    ),
    ExtensionMethod(
        "selfextend",
        "SelfExtend",
        "SelfExtend, neighbour attention inside N/4 tokens and grouped positions beyond, the smallest group "
        "that maps the longest length inside N (Jin et al. 2024, arXiv:2401.01325)",
        remap=_selfextend,
    ),
    ExtensionMethod(
        "rerope",
        "ReRoPE",
        "ReRoPE, every distance past N/4 held at N/4 (Su 2023)",
        remap=lambda train_len, longest: ReRoPE(_neighbour_window(train_len)),
    ),
    ExtensionMethod(
        "leaky-rerope",
        "leaky ReRoPE",
        "leaky ReRoPE, distances past N/4 grow 1/k as fast, the smallest k that keeps the longest length "
        "inside N (Su 2023)",
        remap=_leaky_rerope,
    ),
    ExtensionMethod(
        "string",
        "STRING",
        "STRING, distances past 0.33 N shifted down to W = 128 (N/16 for N below 2048, so that W stays below "
        "the shift), cos and sin times 0.1 ln 2 + 1, as its released code (An et al. 2024, "
        "arXiv:2410.18745); made to use the trained length better, it cannot map more than N tokens inside N",
        remap=_string,
    ),
    ExtensionMethod(
        "dca",
        "Dual Chunk",
        "Dual Chunk Attention, chunks of N - N/32 tokens (the proportions of Qwen2.5-1M's config), positions "
        "as vLLM's (An et al. 2024, arXiv:2402.17463)",
        remap=lambda train_len, longest: DualChunk(train_len, train_len // 32),
    ),
):
    register(_method)
