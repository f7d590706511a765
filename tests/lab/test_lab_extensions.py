"""posenc.lab.extensions and the Encoding they return: extensions are functions of an Encoding, their
modifiers combine with each other and with any score bias, RoPE scaling keeps the scheme's own rotary,
and a new scheme or extension is one registry entry."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import posenc
from posenc import reference
from posenc.lab.config import GPTConfig
from posenc.lab.encoding import Encoding
from posenc.lab.encodings import (
    ENCODINGS,
    EXTENSIONS,
    eval_extension,
    extensions_for,
    register_encoding,
    schemes_with,
)
from posenc.lab.errors import LabError
from posenc.lab.extensions import register_extension, rescaled_rotary
from posenc.lab.model import GPT


def qkv(heads=2, length=12, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, length, dim, generator=g, dtype=torch.float64) for _ in range(3)]


def test_a_window_combines_with_a_score_bias_instead_of_replacing_it():
    # ALiBi under blockwise causal attention: the numpy ALiBi bias plus -inf outside the numpy BCA mask
    q, k, v = qkv()
    alibi = posenc.ALiBi(2).double()
    enc = Encoding(bias=alibi).narrowed(4)
    got = posenc.attention(q, k, v, causal=True, **enc.attend(alibi, 12, 12, 8, "cpu"))
    bias = reference.alibi_bias(12, 2) + np.where(reference.blockwise_causal_mask(12, 12, 4), 0.0, -np.inf)
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), bias=bias, causal=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_modifiers_combine_a_narrower_window_wins_and_scales_multiply():
    enc = Encoding().narrowed(8).narrowed(4).narrowed(6).scaled(2.0).scaled(1.5)
    assert enc.window == 4 and enc.score_scale == 3.0
    q, k, v = qkv(seed=3)
    got = posenc.attention(q, k, v, causal=True, **enc.attend(None, 12, 12, 8, "cpu"))
    mask = np.where(reference.blockwise_causal_mask(12, 12, 4), 0.0, -np.inf)
    want = reference.attention(
        q.numpy(), k.numpy(), v.numpy(), bias=mask, causal=True, scale=3.0 / math.sqrt(8)
    )
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_a_window_refuses_a_bias_that_reads_the_queries():
    shaw = posenc.ShawRelative(8, max_distance=4)
    with pytest.raises(LabError, match="ShawRelative"):
        Encoding().narrowed(4).attend(shaw, 12, 12, 8, "cpu")


def test_rope_scaling_keeps_the_rotary_the_scheme_built():
    # partial rotary in the interleaved layout: PI must keep both and divide the positions by the factor
    rope = posenc.RotaryEmbedding(16, base=500.0, rotary_dim=8, layout="interleaved")
    scaled = rescaled_rotary(rope, {"rope_type": "linear", "factor": 2.0}, train_len=8)
    assert (scaled.head_dim, scaled.rotary_dim, scaled.base, scaled.layout) == (16, 8, 500.0, "interleaved")
    x = torch.randn(1, 2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want = reference.rope(x.numpy(), np.arange(6) / 2.0, base=500.0, rotary_dim=8, layout="interleaved")
    np.testing.assert_allclose(scaled.rotate(x).numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(LabError, match="XPos"):
        rescaled_rotary(posenc.XPos(16), {"rope_type": "linear", "factor": 2.0}, train_len=8)


def test_an_extension_is_a_function_of_the_encoding_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = GPT(GPTConfig(encoding="none", n_layer=1, n_head=2, d_model=16, max_len=8)).eval()
    trained = model.encoding
    extended = EXTENSIONS["temp"](trained, 4.0, 8)
    assert trained.score_scale == 1.0 and extended.score_scale == pytest.approx(math.log(32) / math.log(8))
    with eval_extension(model, "temp", 4.0, 8):
        assert model.encoding == extended
    assert model.encoding is trained


def test_a_new_extension_and_a_new_scheme_are_one_entry_each():
    @register_extension("half-window")
    def _half_window(enc, factor, train_len):
        return enc.narrowed(max(1, train_len // 4))

    @register_encoding("alibi-windowed", extensions=("half-window", "temp"))
    def _alibi_windowed(cfg):
        return Encoding(bias=posenc.ALiBi(cfg.n_head))

    try:
        assert extensions_for("alibi-windowed", tuple(EXTENSIONS)) == ["temp", "half-window"]
        assert schemes_with("half-window") == ["alibi-windowed"]
        torch.manual_seed(0)
        model = GPT(GPTConfig(encoding="alibi-windowed", n_layer=1, n_head=2, d_model=16, max_len=8)).eval()
        x = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(1))
        plain = model(x)
        with eval_extension(model, "half-window", 4.0, 8):
            assert model.attention_window == 2
            windowed = model(x)
        # the first block of two positions sees everything it saw before; later positions lose keys
        torch.testing.assert_close(windowed[:, :2], plain[:, :2], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(windowed[:, 4:], plain[:, 4:], atol=1e-4)
    finally:
        del ENCODINGS["alibi-windowed"], EXTENSIONS["half-window"]


def test_registering_a_scheme_checks_its_extension_names_and_paired_size():
    with pytest.raises(LabError, match="unknown \\['nope'\\]"):
        register_encoding("bad", extensions=("nope",))
    with pytest.raises(LabError, match="pairs='width'"):
        register_encoding("bad", pairs="width")
    assert "bad" not in ENCODINGS


def test_an_extension_from_the_model_keeps_other_modifiers():
    enc = Encoding(rotary=posenc.RotaryEmbedding(8)).scaled(2.0)
    pi = EXTENSIONS["pi"](enc, 4.0, 8)
    assert pi.score_scale == 2.0 and pi.rotary.scaling == {"rope_type": "linear", "factor": 4.0}
    assert replace(pi, rotary=enc.rotary) == enc
