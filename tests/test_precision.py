"""Buffers that hold frequencies, slopes or rates keep their dtype when a model is cast to half precision
(posenc._precision): every module's output after ``.half()`` / ``.to(bfloat16)`` is its float32 output."""

import pytest
import torch

import posenc

MODULES = {
    "SandwichBias": lambda: posenc.SandwichBias(8),
    "ALiBi(6 heads)": lambda: posenc.ALiBi(6),
    "T5Bias": lambda: posenc.T5Bias(4),
    "KerpleBias": lambda: posenc.KerpleBias(4),
    "FireBias": lambda: posenc.FireBias(4, train_len=64),
    "AxialRotaryEmbedding": lambda: posenc.AxialRotaryEmbedding(32),
    "RotaryEmbedding": lambda: posenc.RotaryEmbedding(32),
    "FoPE": lambda: posenc.FoPE(32, 2, train_len=64),
}


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_no_buffer_loses_precision_in_a_half_precision_cast(name, dtype):
    module = MODULES[name]()
    before = {n: b.dtype for n, b in module.named_buffers()}
    module.to(dtype)
    assert {n: b.dtype for n, b in module.named_buffers()} == before
    module.to(torch.device("cpu"))  # a device move still moves them
    assert {n: b.device.type for n, b in module.named_buffers()} == {n: "cpu" for n in before}


@pytest.mark.parametrize("name", ["SandwichBias", "ALiBi(6 heads)"])
def test_a_half_precision_bias_is_the_float32_bias(name):
    want = MODULES[name]().bias(64, 4096, causal=False)
    for dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(
            MODULES[name]().to(dtype).bias(64, 4096, causal=False), want, rtol=0, atol=0
        )
