"""RoPE frequency schedules: one pure function per context-extension method, and the registry that maps a
Hugging Face ``rope_scaling`` / ``rope_parameters`` dict onto them.

Every method function has the same shape::

    fn(dim, *, base, <its own parameters>, seq_len=None) -> (inv_freq, attention_factor)

``dim`` is the rotary dimension (even; ``head_dim * partial_rotary_factor``), ``inv_freq`` a float64 torch
tensor of shape (dim/2,) with omega_k for pair k, and ``attention_factor`` the float that multiplies cos
and sin (as Hugging Face transformers applies it; 1.0 for most methods). Everything is computed in
float64 so that angles p * omega_k stay accurate at positions in the millions; :func:`rope_frequencies`
returns float32, as transformers does.

Methods (registry names in quotes; the formulas follow ``transformers.modeling_rope_utils``, which is
the ground truth the tests compare against):

- "default": omega_k = base^(-2k/dim) (Su et al. 2021).
- "linear": position interpolation, omega_k / factor (Chen et al. 2023, arxiv.org/abs/2306.15595).
- "ntk": static NTK-aware scaling, base -> base * factor^(dim/(dim-2)) (bloc97, 2023).
- "dynamic": dynamic NTK, the NTK base recomputed from the current sequence length (emozilla, 2023).
- "yarn": YaRN, a per-frequency ramp between interpolation and extrapolation plus an attention
  temperature (Peng et al. 2023, arxiv.org/abs/2309.00071).
- "dynamic_yarn": YaRN with factor = max(1, seq_len / original_max_position_embeddings) (same paper, sec. 3.3).
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

__all__ = [
    "METHODS",
    "ScalingSpec",
    "default_frequencies",
    "dynamic_ntk_frequencies",
    "dynamic_yarn_frequencies",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_frequencies",
    "ntk_frequencies",
    "parse_scaling",
    "proportional_frequencies",
    "rope_frequencies",
    "rope_frequencies_float64",
    "yarn_frequencies",
]

Frequencies = tuple[torch.Tensor, float]


def _schedule(dim: int, base: float) -> torch.Tensor:
    """base^(-2k/dim), k = 0 .. dim/2 - 1, float64. Shape (dim/2,)."""
    k = torch.arange(0, dim, 2, dtype=torch.float64)
    return 1.0 / base ** (k / dim)


# ---------------------------------------------------------------------------------------------- methods
def default_frequencies(dim: int, *, base: float = 10000.0, seq_len: int | None = None) -> Frequencies:
    """Plain RoPE, omega_k = base^(-2k/dim) (Su et al. 2021, arxiv.org/abs/2104.09864). inv_freq (dim/2,)."""
    return _schedule(dim, base), 1.0


def linear_frequencies(dim: int, *, base: float = 10000.0, factor: float, seq_len: int | None = None) -> Frequencies:
    """Position interpolation (Chen et al. 2023, arxiv.org/abs/2306.15595): omega_k / factor.

    Dividing every frequency by ``factor`` is the same as dividing every position by it, which keeps the
    angles of a ``factor`` times longer sequence inside the trained range. inv_freq (dim/2,).
    """
    return _schedule(dim, base) / factor, 1.0


def ntk_frequencies(dim: int, *, base: float = 10000.0, factor: float, seq_len: int | None = None) -> Frequencies:
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


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22)
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
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        # the (fractional) rotary dimension whose pair turns `rotations` times over the original context
        return dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

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
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
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
    fn: Callable[..., Frequencies]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    needs_max_position: bool = False  # takes max_position_embeddings from the caller
    length_dependent: bool = False  # inv_freq / attention factor change with seq_len
    factor_key: str | None = "factor"  # the parameter a per-sequence factor overrides


METHODS: dict[str, _Method] = {
    "default": _Method(default_frequencies, (), factor_key=None),
    "linear": _Method(linear_frequencies, ("factor",)),
    "ntk": _Method(ntk_frequencies, ("factor",)),
    "dynamic": _Method(dynamic_ntk_frequencies, ("factor",), needs_max_position=True, length_dependent=True),
    "yarn": _Method(
        yarn_frequencies,
        ("factor", "original_max_position_embeddings"),
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
    ),
    "dynamic_yarn": _Method(
        dynamic_yarn_frequencies,
        ("original_max_position_embeddings",),
        ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
        length_dependent=True,
        factor_key=None,
    ),
    "llama3": _Method(
        llama3_frequencies, ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    ),
    "longrope": _Method(
        longrope_frequencies,
        ("short_factor", "long_factor", "original_max_position_embeddings"),
        ("factor", "attention_factor"),
        length_dependent=True,
        factor_key=None,
    ),
    "proportional": _Method(proportional_frequencies, (), ("factor",)),
}
"""Registry: method name -> its function and the keys its dict takes (besides rope_type/type, rope_theta,
partial_rotary_factor, which every method accepts)."""

_ALIASES = {"su": "longrope"}  # the name early Phi-3 configs used
_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclasses.dataclass(frozen=True)
class ScalingSpec:
    """A validated scaling dict: the method name, its parameters, and the dict's own rope_theta and
    partial_rotary_factor (None when absent). Build with :func:`parse_scaling`."""

    method: str
    params: Mapping[str, object]
    rope_theta: float | None = None
    partial_rotary_factor: float | None = None
    max_position_embeddings: int | None = None

    @property
    def length_dependent(self) -> bool:
        """True when inv_freq depends on the sequence length (dynamic, dynamic_yarn, longrope)."""
        return METHODS[self.method].length_dependent

    @property
    def factor_key(self) -> str | None:
        return METHODS[self.method].factor_key

    def frequencies(self, dim: int, *, base: float, seq_len: int | None = None, factor: float | None = None) -> Frequencies:
        """float64 inv_freq (dim/2,) and attention factor for rotary dimension ``dim``.

        ``factor`` overrides the dict's scaling factor (per-sequence factors); methods without one reject it.
        """
        m = METHODS[self.method]
        kwargs = dict(self.params)
        if factor is not None:
            if m.factor_key is None:
                raise ValueError(
                    f"factor cannot be overridden for rope_type {self.method!r}; methods with a factor: "
                    f"{', '.join(k for k, v in METHODS.items() if v.factor_key)}"
                )
            kwargs[m.factor_key] = _number("factor", factor, minimum=1.0)
        if m.needs_max_position:
            kwargs["max_position_embeddings"] = self.max_position_embeddings
        if self.method == "longrope":
            kwargs["max_position_embeddings"] = self.max_position_embeddings
            for key in ("short_factor", "long_factor"):
                if len(kwargs[key]) != dim // 2:
                    raise ValueError(
                        f"scaling[{key!r}] must have rotary_dim/2 = {dim // 2} entries, got {len(kwargs[key])}"
                    )
        if self.method == "proportional" and self.partial_rotary_factor is not None:
            kwargs["partial_rotary_factor"] = self.partial_rotary_factor
        if seq_len is not None:
            seq_len = _number("seq_len", seq_len, minimum=1, integer=True)
        return m.fn(dim, base=base, seq_len=seq_len, **kwargs)


def _number(name: str, value, minimum: float | None = None, integer: bool = False, strict: bool = False):
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
        kind = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return value


def parse_scaling(scaling, *, max_position_embeddings: int | None = None) -> ScalingSpec:
    """Validate a Hugging Face ``rope_scaling`` (key ``type`` or ``rope_type``) or ``rope_parameters``
    (``rope_theta`` inside) dict. Raises ValueError naming the key, the value and what is accepted."""
    if not isinstance(scaling, Mapping):
        raise ValueError(f"scaling must be a dict like {{'rope_type': 'yarn', 'factor': 4.0, ...}} or None, got {scaling!r}")
    accepted = ", ".join(map(repr, METHODS))
    name = scaling.get("rope_type", scaling.get("type"))
    if name is None:
        raise ValueError(f"scaling needs a 'rope_type' (or 'type') key, one of {accepted}; got keys {sorted(scaling)}")
    name = _ALIASES.get(name, name)
    if name not in METHODS:
        raise ValueError(f"scaling['rope_type'] must be one of {accepted}; got {name!r}")
    m = METHODS[name]
    missing = [k for k in m.required if scaling.get(k) is None]
    if missing:
        raise ValueError(f"scaling for rope_type {name!r} is missing {missing}; it needs {list(m.required)}")
    unknown = sorted(set(scaling) - set(m.required) - set(m.optional) - set(_COMMON_KEYS))
    if unknown:
        raise ValueError(
            f"scaling for rope_type {name!r} has unknown keys {unknown}; accepted: "
            f"{sorted(set(m.required) | set(m.optional) | set(_COMMON_KEYS))}"
        )
    params = {k: scaling[k] for k in (*m.required, *m.optional) if scaling.get(k) is not None}
    _validate(name, params)

    theta = scaling.get("rope_theta")
    if theta is not None:
        theta = float(_number("scaling['rope_theta']", theta, minimum=0, strict=True))
    prf = scaling.get("partial_rotary_factor")
    if prf is not None:
        prf = float(_number("scaling['partial_rotary_factor']", prf, minimum=0, strict=True))
        if prf > 1:
            raise ValueError(f"scaling['partial_rotary_factor'] must be in (0, 1], got {prf!r}")
    if max_position_embeddings is not None:
        _number("max_position_embeddings", max_position_embeddings, minimum=1, integer=True)
    needs_max = m.needs_max_position or (name == "longrope" and "factor" not in params)
    if needs_max and max_position_embeddings is None:
        raise ValueError(
            f"rope_type {name!r} needs max_position_embeddings (the model's context length"
            + (", to derive the factor" if name == "longrope" else "")
            + "), got None"
        )
    return ScalingSpec(name, params, theta, prf, max_position_embeddings)


def _validate(name: str, p: dict) -> None:
    def key(k):
        return f"scaling[{k!r}]"

    if "factor" in p:
        _number(key("factor"), p["factor"], minimum=1.0)
    if "original_max_position_embeddings" in p:
        _number(key("original_max_position_embeddings"), p["original_max_position_embeddings"], minimum=1, integer=True)
    for k in ("beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "attention_factor"):
        if k in p:
            _number(key(k), p[k], minimum=0, strict=True)
    for k in ("mscale", "mscale_all_dim"):
        if k in p:
            _number(key(k), p[k], minimum=0)
    if "truncate" in p and not isinstance(p["truncate"], bool):
        raise ValueError(f"{key('truncate')} must be True or False, got {p['truncate']!r}")
    if p.get("beta_fast", 32.0) < p.get("beta_slow", 1.0):
        raise ValueError(
            f"scaling['beta_fast'] must be >= scaling['beta_slow'], got {p.get('beta_fast', 32.0)!r} < {p.get('beta_slow', 1.0)!r}"
        )
    if name == "llama3" and p["high_freq_factor"] <= p["low_freq_factor"]:
        raise ValueError(
            f"scaling['high_freq_factor'] must be > scaling['low_freq_factor'], got {p['high_freq_factor']!r} <= {p['low_freq_factor']!r}"
        )
    for k in ("short_factor", "long_factor"):
        if k in p:
            v = p[k]
            if isinstance(v, torch.Tensor):
                v = p[k] = v.tolist()
            if not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"{key(k)} must be a non-empty list of numbers > 0, got {v!r}")
            for x in v:
                _number(key(k) + " entries", x, minimum=0, strict=True)


def _rotary_dim(head_dim: int, partial_rotary_factor: float) -> int:
    dim = int(head_dim * partial_rotary_factor)  # int(), as transformers rounds
    if dim < 2 or dim % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor = {head_dim} * {partial_rotary_factor} gives rotary dimension {dim}; "
            "it must be even and >= 2"
        )
    return dim


def rope_frequencies_float64(
    rotary_dim: int,
    *,
    base: float = 10000.0,
    scaling=None,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
) -> Frequencies:
    """float64 inv_freq (rotary_dim/2,) and attention factor for an already resolved rotary dimension.

    ``scaling``: a dict (see :func:`rope_frequencies`), a :class:`ScalingSpec`, or None. The dict's
    rope_theta, if present, replaces ``base``; its partial_rotary_factor is the caller's business
    (:class:`posenc.RotaryEmbedding` resolves it), except for "proportional", where it marks the pairs left unrotated.
    """
    if scaling is None:
        return default_frequencies(rotary_dim, base=base)
    spec = scaling if isinstance(scaling, ScalingSpec) else parse_scaling(scaling, max_position_embeddings=max_position_embeddings)
    theta = base if spec.rope_theta is None else spec.rope_theta
    return spec.frequencies(rotary_dim, base=theta, seq_len=seq_len)


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling=None,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    partial_rotary_factor: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """The RoPE inverse frequencies and attention factor a Hugging Face config describes.

    Args:
        head_dim: size of each attention head.
        base: rope_theta; a ``rope_theta`` inside ``scaling`` (the ``rope_parameters`` form) takes precedence.
        scaling: None, or a ``rope_scaling`` dict (``{"type" or "rope_type": ..., "factor": ...}``) or a
            ``rope_parameters`` dict (``{"rope_type": ..., "rope_theta": ..., ...}``). Methods: see :data:`METHODS`.
        seq_len: the current sequence length, for the length-dependent methods (dynamic, dynamic_yarn, longrope).
        max_position_embeddings: the config's max_position_embeddings (dynamic needs it; longrope without
            ``factor`` derives its factor from it).
        partial_rotary_factor: rotate only int(head_dim * partial_rotary_factor) dimensions; a value inside
            ``scaling`` takes precedence.

    Returns:
        (inv_freq, attention_factor): float32 tensor (rotary_dim/2,), and the float that multiplies cos and sin.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2:
        raise ValueError(f"head_dim must be an integer >= 2, got {head_dim!r}")
    base = float(_number("base", base, minimum=0, strict=True))
    prf = float(_number("partial_rotary_factor", partial_rotary_factor, minimum=0, strict=True))
    if prf > 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
    if seq_len is not None:
        _number("seq_len", seq_len, minimum=1, integer=True)
    if scaling is None:
        inv, attn = default_frequencies(_rotary_dim(head_dim, prf), base=base)
        return inv.to(torch.float32), attn
    spec = scaling if isinstance(scaling, ScalingSpec) else parse_scaling(scaling, max_position_embeddings=max_position_embeddings)
    if spec.partial_rotary_factor is not None:
        prf = spec.partial_rotary_factor
    # "proportional" always returns head_dim/2 frequencies, zero past the rotated fraction
    dim = head_dim if spec.method == "proportional" else _rotary_dim(head_dim, prf)
    theta = base if spec.rope_theta is None else spec.rope_theta
    if spec.method == "proportional":
        spec = dataclasses.replace(spec, partial_rotary_factor=prf)
    inv, attn = spec.frequencies(dim, base=theta, seq_len=seq_len)
    return inv.to(torch.float32), float(attn)
