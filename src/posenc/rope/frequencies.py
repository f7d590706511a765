"""RoPE frequency schedules: one pure function per context-extension method, and the registry that maps a
Hugging Face ``rope_scaling`` / ``rope_parameters`` dict onto them.

Every method function has the same shape::

    fn(dim, *, base, <its own parameters>, seq_len=None) -> (inv_freq, attention_factor)

``dim`` is the rotary dimension (even; ``head_dim * partial_rotary_factor``), ``inv_freq`` a float64 torch
tensor of shape (dim/2,) with omega_k for pair k, and ``attention_factor`` the float that multiplies cos
and sin (as Hugging Face transformers applies it; 1.0 for most methods). Everything is computed in
float64 so that angles p * omega_k stay accurate at positions in the millions; :func:`rope_frequencies`
returns float32 by default, as transformers does.

A scaling dict is validated once into a :class:`Schedule` (method, parameters, base, rotary dimension):
``Schedule.at(seq_len, factor)`` is the one place the method functions are called, by
:func:`rope_frequencies` and by :class:`posenc.RotaryEmbedding` alike.

Methods (registry names in quotes; the formulas follow ``transformers.modeling_rope_utils``, which is
the ground truth the tests compare against):

- "default": omega_k = base^(-2k/dim) (Su et al. 2021).
- "linear": position interpolation, omega_k / factor (Chen et al. 2023, arxiv.org/abs/2306.15595).
- "ntk": static NTK-aware scaling, base -> base * factor^(dim/(dim-2)) (bloc97, 2023).
- "dynamic": dynamic NTK, the NTK base recomputed from the current sequence length (emozilla, 2023).
- "yarn": YaRN, a per-frequency ramp between interpolation and extrapolation plus an attention
  temperature (Peng et al. 2023, arxiv.org/abs/2309.00071).
- "dynamic_yarn": YaRN with factor = max(1, seq_len / original_max_position_embeddings)
  (same paper, sec. 3.3).
- "llama3": Llama 3.1's piecewise wavelength scaling (Meta, "The Llama 3 Herd of Models", 2024).
- "longrope": per-frequency rescale factors, short or long set by sequence length
  (Ding et al. 2024, arxiv.org/abs/2402.13753; Phi-3).
- "proportional": base^(-2k/head_dim) for the first partial_rotary_factor of the pairs, zero for the
  rest, divided by factor (transformers' "proportional" type).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import torch

from .. import _checks
from ..angles import inverse_frequencies as _schedule

__all__ = [
    "ROPE_TYPES",
    "Schedule",
    "default_frequencies",
    "dynamic_ntk_frequencies",
    "dynamic_yarn_frequencies",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_frequencies",
    "ntk_frequencies",
    "proportional_frequencies",
    "resolve_schedule",
    "rope_frequencies",
    "yarn_frequencies",
    "yarn_mscale",
]

Frequencies = tuple[torch.Tensor, float]


# ---------------------------------------------------------------------------------------------- methods
def default_frequencies(dim: int, *, base: float = 10000.0, seq_len: int | None = None) -> Frequencies:
    """Plain RoPE, omega_k = base^(-2k/dim) (Su et al. 2021, arxiv.org/abs/2104.09864). inv_freq (dim/2,)."""
    return _schedule(dim, base), 1.0


def linear_frequencies(
    dim: int, *, base: float = 10000.0, factor: float, seq_len: int | None = None
) -> Frequencies:
    """Position interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595): omega_k / factor.

    Dividing every frequency by ``factor`` is the same as dividing every position by it, which keeps the
    angles of a ``factor`` times longer sequence inside the trained range. inv_freq (dim/2,).
    """
    return _schedule(dim, base) / factor, 1.0


def ntk_frequencies(
    dim: int, *, base: float = 10000.0, factor: float, seq_len: int | None = None
) -> Frequencies:
    """Static NTK-aware scaling (bloc97, 2023; YaRN paper sec. 3.1): base -> base * factor^(dim/(dim-2)).

    The exponent makes the slowest pair exactly ``factor`` times slower (interpolated) while the fastest
    pair is unchanged (extrapolated). inv_freq (dim/2,).
    """
    return _schedule(dim, base * factor ** (dim / (dim - 2))), 1.0


def dynamic_ntk_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    factor: float,
    max_position_embeddings: int,
    seq_len: int | None = None,
) -> Frequencies:
    """Dynamic NTK scaling (emozilla, 2023; YaRN paper sec. 3.3), as transformers' "dynamic" type.

    base -> base * (factor * L / max_position_embeddings - (factor - 1))^(dim/(dim-2)) with
    L = max(seq_len, max_position_embeddings): no change up to the trained length, then a base that grows
    with the sequence. seq_len=None means the trained length. inv_freq (dim/2,).
    """
    length = max_position_embeddings if seq_len is None else max(seq_len, max_position_embeddings)
    scaled = base * (factor * length / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2))
    return _schedule(dim, scaled), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 mscale ln(scale) + 1 (Peng et al. 2023, eq. 22), 1 when
    scale <= 1; DeepSeek's MLA also squares it into the softmax scale (``mscale_all_dim``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
    seq_len: int | None = None,
) -> Frequencies:
    """YaRN (Peng et al. 2023, arxiv.org/abs/2309.00071, sec. 3.2-3.4), as transformers' "yarn" type.

    Pairs that turn more than ``beta_fast`` times over the original context keep their frequency
    (extrapolation); pairs that turn fewer than ``beta_slow`` times are divided by ``factor``
    (interpolation); a linear ramp over the pair index blends the two in between. The attention factor
    (the paper's sqrt(1/t)) is 0.1 ln(factor) + 1, or mscale/mscale_all_dim's ratio of two such terms
    (DeepSeek), or ``attention_factor`` if given. ``truncate`` rounds the ramp's ends to whole pairs.
    inv_freq (dim/2,).
    """
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        # the (fractional) rotary dimension whose pair turns `rotations` times over the original context
        return (
            dim
            * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers does: avoid dividing by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = _schedule(dim, base)
    interpolation = extrapolation / factor
    # ramp = 0: keep the frequency (fast pairs); ramp = 1: interpolate (slow pairs)
    return interpolation * ramp + extrapolation * (1 - ramp), float(attention_factor)


def dynamic_yarn_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    original_max_position_embeddings: int,
    factor: float | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
    seq_len: int | None = None,
) -> Frequencies:
    """Dynamic YaRN (Peng et al. 2023, sec. 3.3): YaRN with factor = max(1, seq_len / original length).

    Up to the original context nothing changes; past it, the scale follows the sequence. ``factor``
    (the target extension, kept in configs) does not enter the frequencies. inv_freq (dim/2,).
    """
    scale = 1.0 if seq_len is None else max(1.0, seq_len / original_max_position_embeddings)
    return yarn_frequencies(
        dim,
        base=base,
        factor=scale,
        original_max_position_embeddings=original_max_position_embeddings,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        mscale=mscale,
        mscale_all_dim=mscale_all_dim,
        attention_factor=attention_factor,
        truncate=truncate,
    )


def llama3_frequencies(
    dim: int,
    *,
    base: float = 500000.0,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
    seq_len: int | None = None,
) -> Frequencies:
    """Llama 3.1 scaling (Meta, "The Llama 3 Herd of Models", 2024), as transformers' "llama3" type.

    With L the original context: wavelengths shorter than L / high_freq_factor are kept, those longer
    than L / low_freq_factor are divided by ``factor`` (position interpolation), and in between a
    smooth blend in L / wavelength. inv_freq (dim/2,).
    """
    inv = _schedule(dim, base)
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
    if high_freq_factor == low_freq_factor:  # an empty blend band (Llama 4 Scout publishes one)
        return out, 1.0
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    blended = (1 - smooth) * inv / factor + smooth * inv
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, out), 1.0


def longrope_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    short_factor,
    long_factor,
    original_max_position_embeddings: int,
    factor: float | None = None,
    max_position_embeddings: int | None = None,
    attention_factor: float | None = None,
    seq_len: int | None = None,
) -> Frequencies:
    """LongRoPE (Ding et al. 2024, arxiv.org/abs/2402.13753), as transformers' "longrope" type (Phi-3).

    omega_k = base^(-2k/dim) / rescale_k with the searched rescale factors ``long_factor`` when
    seq_len > original_max_position_embeddings, else ``short_factor`` (both of length dim/2). The
    attention factor is sqrt(1 + ln(factor) / ln(original length)), factor defaulting to
    max_position_embeddings / original_max_position_embeddings, unless ``attention_factor`` is given.
    inv_freq (dim/2,).
    """
    if factor is None:
        factor = max_position_embeddings / original_max_position_embeddings
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))
    for key, rescale in (("short_factor", short_factor), ("long_factor", long_factor)):
        if len(rescale) != dim // 2:
            raise ValueError(
                f"scaling[{key!r}] must have rotary_dim/2 = {dim // 2} entries, got {len(rescale)}"
            )
    use_long = seq_len is not None and seq_len > original_max_position_embeddings
    rescale = torch.tensor(long_factor if use_long else short_factor, dtype=torch.float64)
    return _schedule(dim, base) / rescale, float(attention_factor)


def proportional_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    factor: float = 1.0,
    partial_rotary_factor: float = 1.0,
    seq_len: int | None = None,
) -> Frequencies:
    """transformers' "proportional" RoPE: ``dim`` is the whole head dimension, the first
    partial_rotary_factor of the pairs get base^(-2k/dim) / factor and the rest frequency 0 (not rotated).
    inv_freq (dim/2,).
    """
    rotated = int(partial_rotary_factor * dim // 2)
    inv = torch.zeros(dim // 2, dtype=torch.float64)
    inv[:rotated] = _schedule(dim, base)[:rotated]
    return inv / factor, 1.0


# ---------------------------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class _Method:
    """How a scaling dict maps onto one method function.

    required / optional: the dict keys the function takes (besides the keys every method accepts).
    context: keyword arguments the function takes from the model rather than the dict
        ("max_position_embeddings", "partial_rotary_factor").
    needs_max_position: a predicate on the dict's parameters: True when max_position_embeddings must be given.
    length_dependent: inv_freq / attention factor change with seq_len.
    factor_key: the parameter a per-sequence factor overrides (None: cannot be overridden).
    whole_head: frequencies span the whole head (zero past the rotated fraction) instead of rotary_dim.
    min_dim: the smallest rotary dimension the method is defined for.
    log_base: the method divides by log(base), so base must exceed 1.
    """

    fn: Callable[..., Frequencies]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    needs_max_position: Callable[[Mapping], bool] = lambda params: False
    length_dependent: bool = False
    factor_key: str | None = "factor"
    whole_head: bool = False
    min_dim: int = 2  # NTK-style methods raise base to d/(d-2): undefined for a single pair
    log_base: bool = False  # divides by log(base): needs base > 1


_YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")

ROPE_TYPES: dict[str, _Method] = {
    "default": _Method(default_frequencies, factor_key=None),
    "linear": _Method(linear_frequencies, ("factor",)),
    "ntk": _Method(ntk_frequencies, ("factor",), min_dim=4),
    "dynamic": _Method(
        dynamic_ntk_frequencies,
        ("factor",),
        context=("max_position_embeddings",),
        needs_max_position=lambda params: True,
        length_dependent=True,
        min_dim=4,
    ),
    "yarn": _Method(
        yarn_frequencies, ("factor", "original_max_position_embeddings"), _YARN_OPTIONAL, log_base=True
    ),
    "dynamic_yarn": _Method(
        dynamic_yarn_frequencies,
        ("original_max_position_embeddings",),
        ("factor", *_YARN_OPTIONAL),
        length_dependent=True,
        factor_key=None,
        log_base=True,
    ),
    "llama3": _Method(
        llama3_frequencies,
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    ),
    "longrope": _Method(
        longrope_frequencies,
        ("short_factor", "long_factor", "original_max_position_embeddings"),
        ("factor", "attention_factor"),
        context=("max_position_embeddings",),
        needs_max_position=lambda params: "factor" not in params,  # the factor is derived from it
        length_dependent=True,
        factor_key=None,
    ),
    "proportional": _Method(
        proportional_frequencies, (), ("factor",), context=("partial_rotary_factor",), whole_head=True
    ),
}
"""Registry: method name -> its function and the keys its dict takes (besides rope_type/type, rope_theta,
partial_rotary_factor, which every method accepts)."""

_ALIASES = {"su": "longrope"}  # the name early Phi-3 configs used
_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A resolved RoPE frequency schedule: method, parameters, base and the dimensions it covers.

    Build with :func:`resolve_schedule`. ``rotary_dim`` is how many dimensions of a head rotate; ``freq_dim``
    is the dimension the method's schedule is computed over (rotary_dim, or the whole head for
    "proportional").
    """

    method: str
    params: Mapping[str, object]
    base: float
    head_dim: int
    rotary_dim: int
    max_position_embeddings: int | None = None
    partial_rotary_factor: float = 1.0

    @property
    def length_dependent(self) -> bool:
        """True when inv_freq depends on the sequence length (dynamic, dynamic_yarn, longrope)."""
        return ROPE_TYPES[self.method].length_dependent

    @property
    def factor_key(self) -> str | None:
        return ROPE_TYPES[self.method].factor_key

    @property
    def freq_dim(self) -> int:
        return self.head_dim if ROPE_TYPES[self.method].whole_head else self.rotary_dim

    def at(self, seq_len: int | None = None, factor: float | None = None) -> Frequencies:
        """float64 inv_freq (freq_dim/2,) and attention factor at sequence length ``seq_len`` (None: the
        original context), with the dict's scaling factor replaced by ``factor`` if given."""
        m = ROPE_TYPES[self.method]
        kwargs = dict(self.params)
        if factor is not None:
            if m.factor_key is None:
                raise ValueError(
                    f"factor cannot be overridden for rope_type {self.method!r}; methods with a factor: "
                    f"{', '.join(k for k, v in ROPE_TYPES.items() if v.factor_key)}"
                )
            kwargs[m.factor_key] = _checks.number("factor", factor, minimum=1.0)
        context = {
            "max_position_embeddings": self.max_position_embeddings,
            "partial_rotary_factor": self.partial_rotary_factor,
        }
        kwargs.update({k: context[k] for k in m.context})
        if seq_len is not None:
            seq_len = _checks.number("seq_len", seq_len, minimum=1, integer=True)
        return m.fn(self.freq_dim, base=self.base, seq_len=seq_len, **kwargs)


def _method_and_params(scaling) -> tuple[str, dict]:
    """Validate a scaling dict's method name and keys; returns (method, its parameters)."""
    if not isinstance(scaling, Mapping):
        raise ValueError(
            f"scaling must be a dict like {{'rope_type': 'yarn', 'factor': 4.0, ...}} or None, got "
            f"{scaling!r}"
        )
    accepted = ", ".join(map(repr, ROPE_TYPES))
    name = scaling.get("rope_type", scaling.get("type"))
    if scaling.get("type") is not None and scaling.get("rope_type") not in (None, scaling["type"]):
        raise ValueError(
            f"scaling has both rope_type={scaling['rope_type']!r} and type={scaling['type']!r}; "
            "give one of them"
        )
    if name is None:
        raise ValueError(
            f"scaling needs a 'rope_type' (or 'type') key, one of {accepted}; got keys {sorted(scaling)}"
        )
    name = _ALIASES.get(name, name)
    if name not in ROPE_TYPES:
        raise ValueError(f"scaling['rope_type'] must be one of {accepted}; got {name!r}")
    m = ROPE_TYPES[name]
    missing = [k for k in m.required if scaling.get(k) is None]
    if missing:
        raise ValueError(f"scaling for rope_type {name!r} is missing {missing}; it needs {list(m.required)}")
    known = set(m.required) | set(m.optional) | set(_COMMON_KEYS)
    unknown = sorted(set(scaling) - known)
    if unknown:
        raise ValueError(
            f"scaling for rope_type {name!r} has unknown keys {unknown}; accepted: {sorted(known)}"
        )
    params = {k: scaling[k] for k in (*m.required, *m.optional) if scaling.get(k) is not None}
    _validate(name, params)
    return name, params


def _validate(name: str, p: dict) -> None:
    def key(k):
        return f"scaling[{k!r}]"

    if "factor" in p:
        _checks.number(key("factor"), p["factor"], minimum=1.0)
    if "original_max_position_embeddings" in p:
        _checks.number(
            key("original_max_position_embeddings"),
            p["original_max_position_embeddings"],
            minimum=1,
            integer=True,
        )
    for k in ("beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "attention_factor"):
        if k in p:
            _checks.number(key(k), p[k], minimum=0, strict=True)
    for k in ("mscale", "mscale_all_dim"):
        if k in p:
            _checks.number(key(k), p[k], minimum=0)
    if "truncate" in p and not isinstance(p["truncate"], bool):
        raise ValueError(f"{key('truncate')} must be True or False, got {p['truncate']!r}")
    if p.get("beta_fast", 32.0) < p.get("beta_slow", 1.0):
        raise ValueError(
            f"scaling['beta_fast'] must be >= scaling['beta_slow'], got {p.get('beta_fast', 32.0)!r} < "
            f"{p.get('beta_slow', 1.0)!r}"
        )
    if name == "longrope" and p["original_max_position_embeddings"] < 2:
        raise ValueError(  # its attention factor divides by log(original length)
            f"{key('original_max_position_embeddings')} must be >= 2 for rope_type 'longrope', "
            f"got {p['original_max_position_embeddings']!r}"
        )
    if name == "llama3" and p["high_freq_factor"] < p["low_freq_factor"]:
        raise ValueError(
            "scaling['high_freq_factor'] must be >= scaling['low_freq_factor'], got "
            f"{p['high_freq_factor']!r} < {p['low_freq_factor']!r}"
        )
    for k in ("short_factor", "long_factor"):
        if k in p:
            v = p[k]
            if isinstance(v, torch.Tensor):
                v = p[k] = v.tolist()
            if not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"{key(k)} must be a non-empty list of numbers > 0, got {v!r}")
            for x in v:
                _checks.number(key(k) + " entries", x, minimum=0, strict=True)


def _partial_rotary_factor(name: str, value) -> float:
    value = float(_checks.number(name, value, minimum=0, strict=True))
    if value > 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return value


def resolve_schedule(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling=None,
    rotary_dim: int | None = None,
    partial_rotary_factor: float | None = None,
    max_position_embeddings: int | None = None,
) -> Schedule:
    """Validate everything that defines a RoPE schedule, once. Pure: nothing passed in is modified.

    A ``rope_theta`` inside ``scaling`` (the ``rope_parameters`` form) replaces ``base``; a
    ``partial_rotary_factor`` inside it replaces the argument. The rotary dimension is ``rotary_dim`` if
    given, else int(head_dim * partial_rotary_factor) (as transformers rounds); both given must agree.
    Raises ValueError naming the argument or key, the value and what is accepted.
    """
    head_dim = _checks.positive_int("head_dim", head_dim, minimum=2, size=True)
    base = float(_checks.number("base", base, minimum=0, strict=True))
    name, params = ("default", {}) if scaling is None else _method_and_params(scaling)
    if scaling is not None and scaling.get("rope_theta") is not None:
        base = float(_checks.number("scaling['rope_theta']", scaling["rope_theta"], minimum=0, strict=True))
    prf = (
        None
        if partial_rotary_factor is None
        else _partial_rotary_factor("partial_rotary_factor", partial_rotary_factor)
    )
    if scaling is not None and scaling.get("partial_rotary_factor") is not None:
        prf = _partial_rotary_factor("scaling['partial_rotary_factor']", scaling["partial_rotary_factor"])
    if max_position_embeddings is not None:
        _checks.number("max_position_embeddings", max_position_embeddings, minimum=1, integer=True)
    if ROPE_TYPES[name].needs_max_position(params) and max_position_embeddings is None:
        raise ValueError(
            f"rope_type {name!r} needs max_position_embeddings (the model's context length"
            + (", to derive the factor" if name == "longrope" else "")
            + "), got None"
        )
    if ROPE_TYPES[name].log_base and base <= 1:
        raise ValueError(
            f"rope_type {name!r} needs a base (rope_theta) > 1 (its ramp divides by log(base)), got {base!r}"
        )
    rotary_dim = _rotary_dim(head_dim, rotary_dim, None if ROPE_TYPES[name].whole_head else prf)
    if rotary_dim < ROPE_TYPES[name].min_dim:
        raise ValueError(
            f"rope_type {name!r} needs a rotary dimension >= {ROPE_TYPES[name].min_dim} (it raises the base "
            f"to the power d/(d-2)), got {rotary_dim}"
        )
    return Schedule(
        name, params, base, head_dim, rotary_dim, max_position_embeddings, 1.0 if prf is None else prf
    )


def _rotary_dim(head_dim: int, rotary_dim: int | None, prf: float | None) -> int:
    """The rotated dimensions: rotary_dim, or int(head_dim * prf), whichever is given (both must agree)."""
    if rotary_dim is not None:
        rotary_dim = _checks.even_int("rotary_dim", rotary_dim)
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    if prf is None:
        return head_dim if rotary_dim is None else rotary_dim
    dim = int(head_dim * prf)  # int(), as transformers rounds
    if dim < 2 or dim % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor = {head_dim} * {prf} gives rotary dimension {dim}; "
            "it must be even and >= 2"
        )
    if rotary_dim is not None and rotary_dim not in (dim, head_dim):
        raise ValueError(
            f"rotary_dim={rotary_dim} disagrees with partial_rotary_factor={prf} "
            f"(head_dim * factor = {dim}); give one of them"
        )
    return dim


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling=None,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    partial_rotary_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> Frequencies:
    """The RoPE inverse frequencies and attention factor a Hugging Face config describes.

    Args:
        head_dim: size of each attention head.
        base: rope_theta; a ``rope_theta`` inside ``scaling`` (the ``rope_parameters`` form) takes precedence.
        scaling: None, or a ``rope_scaling`` dict (``{"type" or "rope_type": ..., "factor": ...}``) or a
            ``rope_parameters`` dict (``{"rope_type": ..., "rope_theta": ..., ...}``). Methods: see
            :data:`ROPE_TYPES`.
        seq_len: the current sequence length, for the length-dependent methods (dynamic, dynamic_yarn,
            longrope).
        max_position_embeddings: the config's max_position_embeddings (dynamic needs it; longrope without
            ``factor`` derives its factor from it).
        partial_rotary_factor: rotate only int(head_dim * partial_rotary_factor) dimensions; a value inside
            ``scaling`` takes precedence.
        dtype: of the returned frequencies; float32 as transformers returns them, or float64 (computed in
            float64 either way).

    Returns:
        (inv_freq, attention_factor): a tensor (rotary_dim/2,) (head_dim/2 for "proportional", zero past the
        rotated fraction), and the float that multiplies cos and sin.
    """
    schedule = resolve_schedule(
        head_dim,
        base=base,
        scaling=scaling,
        partial_rotary_factor=partial_rotary_factor,
        max_position_embeddings=max_position_embeddings,
    )
    inv, attn = schedule.at(seq_len)
    return inv.to(dtype), float(attn)
