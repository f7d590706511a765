"""The fope scheme: posenc.FoPE (Hua et al. 2024, arxiv.org/abs/2412.17739) built from the lab's head size,
heads, RoPE base and training length; its coefficients are the model's state, it decodes with a KV cache
past the training length like a full pass, and it trains."""

import math

import numpy as np
import torch

import posenc
from posenc import reference as R
from posenc.lab.checkpoint import load_model, save_checkpoint
from posenc.lab.config import GPTConfig
from posenc.lab.model import GPT, KVCache
from posenc.lab.train import TrainConfig, make_optimizer


def model(seed=0, max_len=64, d_model=32, n_head=2):
    torch.manual_seed(seed)
    return GPT(GPTConfig(encoding="fope", n_layer=2, n_head=n_head, d_model=d_model, max_len=max_len)).eval()


def ids(batch, length, seed=1):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_lab_builds_fope_from_its_config():
    m = model(max_len=64, d_model=32, n_head=2)
    rotary = m.rotary
    assert isinstance(rotary, posenc.FoPE)
    assert (rotary.head_dim, rotary.heads, rotary.train_len, rotary.base) == (16, 2, 64, m.cfg.rope_base)
    freqs, series = R.fope_frequencies(16, m.cfg.rope_base, 64)
    np.testing.assert_allclose(rotary.frequencies.numpy(), freqs, rtol=1e-15)
    assert rotary.active == series.sum() == 3 and rotary.sigma == 0.3  # 1, 10^-0.5, 0.1 >= 2 pi / 64
    assert {"rotary.cos_coef", "rotary.sin_coef"} <= set(m.state_dict())
    assert not any(n.startswith("rotary.") for n, _ in m.named_parameters())  # fixed, as in the paper


def test_a_checkpoint_brings_back_the_drawn_coefficients(tmp_path):
    m = model(seed=0)
    other = model(seed=1)
    assert not torch.equal(m.rotary.cos_coef, other.rotary.cos_coef)
    x = ids(2, 20)
    save_checkpoint(tmp_path / "run", 0, m, None, {"model": m.cfg.to_dict()})
    torch.manual_seed(7)  # the model is rebuilt, drawing other coefficients, before its state is loaded
    back, _ = load_model(tmp_path / "run")
    assert torch.equal(back.rotary.cos_coef, m.rotary.cos_coef)
    torch.testing.assert_close(back(x), m(x), rtol=0, atol=0)


def test_cached_decoding_past_the_training_length_equals_the_full_pass():
    m = model(max_len=16)
    x = ids(2, 50, seed=3)
    cache = KVCache(2)
    steps = [m(x[:, :9], cache)] + [m(x[:, t : t + 1], cache) for t in range(9, 50)]
    torch.testing.assert_close(torch.cat(steps, 1), m(x), rtol=1e-4, atol=1e-4)


def test_the_scheme_trains_a_few_steps():
    m = model().train()
    x = ids(4, 33, seed=2)
    opt = make_optimizer(m, TrainConfig(lr=3e-3))
    losses = []
    for _ in range(4):
        loss = m.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
