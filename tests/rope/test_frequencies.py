"""posenc.rope.frequencies against transformers' ROPE_INIT_FUNCTIONS (the ground truth) and
posenc.reference."""

import contextlib
import itertools
import math
import types

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import GPTNeoXConfig, LlamaConfig
from transformers import modeling_rope_utils as rope_utils
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox import modeling_gpt_neox as gpt_neox_modeling
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

import posenc
from posenc import extension
from posenc import reference as R
from posenc.rope import frequencies as F

REL = 1e-6
HF_FLOAT32_REL = (
    2.5e-6  # transformers' own float32 evaluation error (measured against its float64 run: <= 1.7e-6)
)
ORIG = 2048  # the "original" (pretraining) context of every grid case
FACTORS = [1.5, 4.0, 8.0, 32.0]
HEAD_DIMS = [64, 80, 128]
BASES = [1e4, 5e5, 1e6]
SEQ_LENS = [ORIG // 2, ORIG, 3 * ORIG]  # below, at and above the original length


class _Float64Torch(types.ModuleType):
    """torch, except that float32 means float64: runs transformers' own RoPE code in double precision."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def transformers_in_float64():
    # transformers evaluates its schedules in float32, which is off by up to ~2e-6 relative at base 1e6;
    # swapping the `torch` its modules see gives the same formulas in float64, the fair ground truth.
    mods = [rope_utils, gpt_neox_modeling]
    saved = [m.torch for m in mods]
    for m in mods:
        m.torch = _Float64Torch("torch")
    try:
        yield
    finally:
        for m, t in zip(mods, saved, strict=True):
            m.torch = t


def hf_frequencies(params: dict, head_dim: int, max_pos: int, seq_len=None):
    """transformers' inv_freq and attention factor for a rope_parameters dict, through a real config."""
    params = dict(params)
    rope_type = params["rope_type"]
    if rope_type == "default":  # Llama's default ignores partial_rotary_factor; GPT-NeoX's honours it
        cfg = GPTNeoXConfig(
            hidden_size=head_dim * 2,
            num_attention_heads=2,
            rope_parameters=params,
            max_position_embeddings=max_pos,
        )
        return GPTNeoXRotaryEmbedding.compute_default_rope_parameters(cfg)
    cfg = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    return ROPE_INIT_FUNCTIONS[rope_type](cfg, None, seq_len=seq_len)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    nz = b != 0
    assert torch.equal(nz, a != 0), "zero frequencies in different places"
    return float(((a[nz] - b[nz]).abs() / b[nz].abs()).max()) if nz.any() else 0.0


def grid_params(rope_type: str, factor: float, head_dim: int, prf: float):
    dim = int(head_dim * prf)
    common = {"rope_type": rope_type, "partial_rotary_factor": prf}
    if rope_type == "default":
        yield common
    elif rope_type in ("linear", "dynamic", "proportional"):
        yield {**common, "factor": factor}
    elif rope_type == "yarn":
        base = {**common, "factor": factor, "original_max_position_embeddings": ORIG}
        yield base
        yield {**base, "beta_fast": 16, "beta_slow": 2, "truncate": False}
        yield {**base, "mscale": 0.707, "mscale_all_dim": 1.0}
        yield {**base, "attention_factor": 0.9}
    elif rope_type == "llama3":
        yield {
            **common,
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIG,
        }
        yield {
            **common,
            "factor": factor,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": ORIG,
        }
    elif rope_type == "longrope":
        long = np.linspace(1.0, factor, dim // 2).tolist()
        short = np.linspace(1.0, 1.0 + factor / 10, dim // 2).tolist()
        base = {
            **common,
            "short_factor": short,
            "long_factor": long,
            "original_max_position_embeddings": ORIG,
        }
        yield base  # factor from max_position_embeddings / original
        yield {**base, "factor": factor}
        yield {**base, "attention_factor": 1.25}


HF_TYPES = ["default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"]


def test_every_transformers_rope_type_is_covered():
    assert set(ROPE_INIT_FUNCTIONS) | {"default"} <= set(HF_TYPES) <= set(F.ROPE_TYPES)


@pytest.mark.parametrize("rope_type", HF_TYPES)
def test_matches_transformers_on_grid(rope_type):
    """inv_freq to 1e-6 relative and the attention factor against transformers' code run in float64, and
    against transformers as shipped (float32) within its own rounding."""
    worst = {"inv64": 0.0, "inv32": 0.0, "hf32": 0.0, "attn": 0.0}
    n = 0
    for factor, head_dim, base in itertools.product(FACTORS, HEAD_DIMS, BASES):
        prf = 0.5 if head_dim == 80 else 1.0  # partial rotary on one head size (GPT-NeoX, Phi style)
        max_pos = ORIG if rope_type == "dynamic" else int(ORIG * factor)
        for params in grid_params(rope_type, factor, head_dim, prf):
            params = {**params, "rope_theta": base}
            lengths = SEQ_LENS if F.ROPE_TYPES[rope_type].length_dependent else [None]
            for seq_len in lengths:
                hf32, hf_attn32 = hf_frequencies(params, head_dim, max_pos, seq_len)
                with transformers_in_float64():
                    hf64, hf_attn = hf_frequencies(params, head_dim, max_pos, seq_len)
                assert hf64.dtype == torch.float64
                inv, attn = posenc.rope_frequencies(
                    head_dim, scaling=params, seq_len=seq_len, max_position_embeddings=max_pos
                )
                inv64, _ = F.rope_frequencies(
                    head_dim,
                    scaling=params,
                    max_position_embeddings=max_pos,
                    seq_len=seq_len,
                    dtype=torch.float64,
                )
                assert inv.dtype == torch.float32 and inv.shape == hf32.shape, (params, inv.shape, hf32.shape)
                worst["inv32"] = max(worst["inv32"], rel_err(inv, hf64))
                worst["inv64"] = max(worst["inv64"], rel_err(inv64, hf64))
                worst["hf32"] = max(worst["hf32"], rel_err(inv, hf32))
                worst["attn"] = max(
                    worst["attn"], abs(attn - hf_attn) / abs(hf_attn), abs(attn - hf_attn32) / abs(hf_attn32)
                )
                n += 1
    print(
        f"{rope_type}: {n} cases, worst relative errors "
        + ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
    )
    assert worst["inv32"] <= REL and worst["attn"] <= REL
    # same formulas, same precision (longrope's exponent goes through Tensor.float(), which the swap cannot
    # reach)
    assert worst["inv64"] <= (REL if rope_type == "longrope" else 1e-12)
    assert worst["hf32"] <= HF_FLOAT32_REL


@pytest.mark.parametrize("seq_len", [ORIG // 2, ORIG, ORIG + 1, 5 * ORIG])
def test_dynamic_yarn_is_yarn_at_the_current_scale(seq_len):
    # dynamic YaRN at length L is transformers' YaRN with factor L / original (1 up to the original length)
    head_dim, base = 128, 1e4
    params = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": ORIG, "rope_theta": base}
    inv, attn = posenc.rope_frequencies(head_dim, scaling=params, seq_len=seq_len)
    scale = max(1.0, seq_len / ORIG)
    hf_inv, hf_attn = hf_frequencies(
        {"rope_type": "yarn", "factor": scale, "original_max_position_embeddings": ORIG, "rope_theta": base},
        head_dim,
        ORIG,
    )
    assert rel_err(inv, hf_inv) <= REL and abs(attn - hf_attn) <= REL
    if seq_len <= ORIG:
        assert rel_err(inv, torch.from_numpy(R.inverse_frequencies(head_dim, base))) <= REL and attn == 1.0


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_static_ntk(factor, head_dim):
    base = 1e4
    inv, attn = posenc.rope_frequencies(head_dim, scaling={"type": "ntk", "factor": factor})
    expected = R.inverse_frequencies(head_dim, base * factor ** (head_dim / (head_dim - 2)))
    assert rel_err(inv, torch.from_numpy(expected)) <= REL and attn == 1.0
    # the same base as transformers' dynamic NTK with factor f-1 at twice the trained length
    hf_inv, _ = hf_frequencies(
        {"rope_type": "dynamic", "factor": factor - 1, "rope_theta": base}, head_dim, ORIG, 2 * ORIG
    )
    assert rel_err(inv, hf_inv) <= REL
    # slowest pair exactly factor times slower, fastest unchanged: the point of the exponent
    default = R.inverse_frequencies(head_dim, base)
    assert inv[0] == pytest.approx(default[0], rel=REL)
    assert float(default[-1] / inv[-1]) == pytest.approx(factor, rel=REL)


def test_rope_scaling_and_rope_parameters_forms_agree():
    old = {"type": "linear", "factor": 4.0}
    new = {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5, "partial_rotary_factor": 0.5}
    a, _ = posenc.rope_frequencies(128, base=5e5, scaling=old, partial_rotary_factor=0.5)
    b, _ = posenc.rope_frequencies(
        128, scaling=new
    )  # rope_theta and partial_rotary_factor from inside the dict
    assert a.shape == (32,) and torch.equal(a, b)
    expected = R.inverse_frequencies(64, 5e5) / 4
    assert rel_err(a, torch.from_numpy(expected)) <= REL


def test_default_is_reference():
    inv, attn = posenc.rope_frequencies(64, base=1e6)
    assert (
        inv.dtype == torch.float32
        and rel_err(inv, torch.from_numpy(R.inverse_frequencies(64, 1e6))) <= REL
        and attn == 1.0
    )


def test_float64_is_accurate():
    inv, _ = F.rope_frequencies(
        128, base=5e5, scaling={"rope_type": "linear", "factor": 8.0}, dtype=torch.float64
    )
    assert inv.dtype == torch.float64
    np.testing.assert_allclose(inv.numpy(), R.inverse_frequencies(128, 5e5) / 8, rtol=1e-14)


BAD = [
    ({"rope_type": "nope"}, "rope_type"),
    ({"factor": 2.0}, "rope_type"),
    ({"rope_type": "linear"}, "factor"),
    ({"rope_type": "linear", "factor": 0.5}, "factor"),
    ({"rope_type": "linear", "factor": float("nan")}, "factor"),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "unknown keys"),
    ({"rope_type": "yarn", "factor": 2.0}, "original_max_position_embeddings"),
    (
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
        "original_max_position_embeddings",
    ),
    (
        {
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 1,
            "beta_slow": 32,
        },
        "beta_fast",
    ),
    (
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "truncate": "yes"},
        "truncate",
    ),
    (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 4.0,
            "high_freq_factor": 1.0,
            "original_max_position_embeddings": 64,
        },
        "high_freq_factor",
    ),
    (
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [1.0] * 32,
            "original_max_position_embeddings": 64,
            "factor": 2.0,
        },
        "short_factor",
    ),
    (
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [0.0] * 32,
            "original_max_position_embeddings": 64,
            "factor": 2.0,
        },
        "long_factor",
    ),
    (
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [1.0] * 32,
            "original_max_position_embeddings": 64,
        },
        "max_position_embeddings",
    ),
    ({"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": -1.0}, "rope_theta"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.01}, "rotary dimension"),
    ("linear", "scaling"),
]


@pytest.mark.parametrize("scaling, word", BAD)
def test_bad_scaling_raises_naming_the_problem(scaling, word):
    with pytest.raises(ValueError, match=word) as err:
        posenc.rope_frequencies(64, scaling=scaling)
    if word == "rope_type":
        assert "'yarn'" in str(err.value) and "'llama3'" in str(err.value)  # lists what is accepted


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"base": 0.0}, "base"),
        ({"partial_rotary_factor": 0}, "partial_rotary_factor"),
        (
            {"seq_len": -3, "scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8},
            "seq_len",
        ),
    ],
)
def test_bad_arguments_raise(kwargs, word):
    with pytest.raises(ValueError, match=word):
        posenc.rope_frequencies(64, **kwargs)


def test_registry_functions_have_papers_in_docstrings():
    for name, m in F.ROPE_TYPES.items():
        doc = m.fn.__doc__ or ""
        assert re_year(doc), f"{name}: {m.fn.__name__} docstring should cite its source"


def re_year(doc: str) -> bool:
    return any(str(y) in doc for y in range(2017, 2026)) or "transformers" in doc


def test_yarn_attention_factor_formula():
    # the paper's sqrt(1/t) = 0.1 ln s + 1
    _, attn = posenc.rope_frequencies(
        64, scaling={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}
    )
    assert attn == pytest.approx(0.1 * math.log(16.0) + 1.0, rel=1e-12)


@given(
    head_dim=st.sampled_from([16, 32, 64, 96, 128, 256]),
    base=st.floats(100.0, 1e7),
    factor=st.floats(1.0, 64.0),
    orig=st.integers(16, 200_000),
    beta_slow=st.floats(0.25, 4.0),
    beta_gap=st.floats(0.0, 64.0),
    truncate=st.booleans(),
    low_freq=st.floats(0.5, 4.0),
    high_gap=st.floats(0.1, 8.0),
)
def test_yarn_and_llama3_match_transformers_anywhere(
    head_dim, base, factor, orig, beta_slow, beta_gap, truncate, low_freq, high_gap
):
    # random continuous parameters reach the ramp's edge cases (empty ramp, clamped ends) the grid may miss
    yarn = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": orig,
        "rope_theta": base,
        "beta_fast": beta_slow + beta_gap,
        "beta_slow": beta_slow,
        "truncate": truncate,
    }
    llama3 = {
        "rope_type": "llama3",
        "factor": factor,
        "original_max_position_embeddings": orig,
        "rope_theta": base,
        "low_freq_factor": low_freq,
        "high_freq_factor": low_freq + high_gap,
    }
    for params in (yarn, llama3):
        with transformers_in_float64():
            hf64, hf_attn = hf_frequencies(params, head_dim, orig)
        inv, attn = posenc.rope_frequencies(head_dim, scaling=params)
        assert rel_err(inv, hf64) <= REL and attn == pytest.approx(hf_attn, rel=1e-12)


def test_llama3_with_an_empty_blend_band():
    """Llama 4 Scout publishes low_freq_factor == high_freq_factor: no blend, each wavelength kept or
    divided by the factor according to which side of L / low_freq_factor it falls."""
    orig, factor, band = 8192, 16.0, 1.0
    params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": band, "high_freq_factor": band}
    inv, _ = posenc.rope_frequencies(
        128, base=5e5, scaling={**params, "original_max_position_embeddings": orig}
    )
    default = R.inverse_frequencies(128, 5e5)
    want = np.where(2 * math.pi / default > orig / band, default / factor, default)
    np.testing.assert_allclose(inv.double().numpy(), want, rtol=1e-6)
    assert (want != default).any() and (want == default).any()  # both sides of the band occur


@pytest.mark.parametrize("method", [n for n, m in extension.METHODS.items() if m.kind == "frequencies"])
def test_extension_scaling_gives_transformers_the_frequencies_of_its_method(method):
    """Every short name's dict, read by transformers' own init function, gives posenc's frequencies; static
    NTK, which transformers lacks, is its default schedule at the raised base."""
    scaling = extension.extension_scaling(method, 4.0, ORIG)
    got, _ = F.rope_frequencies(
        64, scaling=scaling, base=1e4, max_position_embeddings=ORIG, seq_len=3 * ORIG, dtype=torch.float64
    )
    if method == "ntk":
        want = 1.0 / (1e4 * 4.0 ** (64 / 62)) ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    else:
        config = LlamaConfig(
            hidden_size=128,
            num_attention_heads=2,
            max_position_embeddings=ORIG,
            rope_parameters={"rope_theta": 1e4, **scaling},
        )
        want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu", seq_len=3 * ORIG)
    torch.testing.assert_close(got, want.to(torch.float64), rtol=HF_FLOAT32_REL, atol=0)


def test_extension_scaling_refuses_an_unknown_method_by_name():
    with pytest.raises(ValueError, match=r"method must be one of 'pi', 'ntk'.*got 'rerope'"):
        extension.extension_scaling("rerope", 2.0, 4096)
    with pytest.raises(ValueError, match=r"method must be one of 'pi', 'ntk'.*got 'rope'"):
        extension.extension_scaling("rope", 2.0, 4096)
