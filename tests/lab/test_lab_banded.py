"""The banded scheme: Inkling's RoPE-free attention (Thinking Machines Lab 2026), NoPE with a banded relative
bias r_i . P[:, i - j] per layer (r from the layer's normalised hidden state, through Encoding.hidden_terms
and posenc.attention(bias=BandedBias)) and the fixed temperature 1 + 0.1 log(max(n / L, 1)) on q
and r: a zero table is NoPE, a layer attends as the reference past the training length, r and P learn,
cached decoding equals the full pass, and it evaluates at 16x its training length."""

import math

import numpy as np
import pytest
import torch

import posenc
from posenc import reference as R
from posenc.lab.config import GPTConfig
from posenc.lab.evaluate import perplexities
from posenc.lab.model import GPT, KVCache, _per_layer

from .conftest import train_hidden_terms


def model(encoding="banded", seed=0, max_len=16, n_layer=2):
    torch.manual_seed(seed)
    cfg = GPTConfig(encoding=encoding, n_layer=n_layer, n_head=2, d_model=16, max_len=max_len)
    return GPT(cfg).eval()


def ids(batch, length, seed=1):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def set_tables(m, std, seed=4):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for terms in m.hidden_terms:
            terms.module.table.normal_(std=std, generator=gen)
            terms.module.proj.weight.normal_(std=max(std, 0.02), generator=gen)


def test_the_defaults_are_inklings_d_rel_and_half_the_training_length():
    m = model(max_len=16)
    rel = m.hidden_terms[0].module
    assert isinstance(rel, posenc.BandedRelative) and (rel.d_rel, rel.extent, rel.n_heads) == (16, 8, 2)
    assert m.query_scales is None  # the temperature is fixed, as Inkling's
    assert [k for k in m.state_dict() if k.startswith("hidden_terms.")] == [
        f"hidden_terms.{i}.module.{p}" for i in (0, 1) for p in ("table", "proj.weight")
    ]


@pytest.mark.parametrize("offset", [0, 10, 40])
def test_the_temperature_is_one_up_to_the_training_length_then_grows_like_a_tenth_of_log_n(offset):
    m = model(max_len=16)
    factor = next(_per_layer(m, 6, offset, None, "cpu"))["query_scale"]
    n = np.arange(offset + 1, offset + 7)
    want = 1 + 0.1 * np.log(np.maximum(n / 16, 1))
    assert tuple(factor.shape) == (1, 6)  # one factor per row, the same for every head
    np.testing.assert_allclose(factor[0].numpy(), want, rtol=1e-6)


def test_a_zero_table_is_nope_and_a_table_moves_every_later_position():
    banded, nope = model(), model("none")
    nope.load_state_dict({k: v for k, v in banded.state_dict().items() if not k.startswith("hidden_terms.")})
    x = ids(2, 12)
    set_tables(banded, 0.0)  # P = 0: no bias, and within the training length tau = 1
    torch.testing.assert_close(banded(x), nope(x), rtol=0, atol=1e-6)
    set_tables(banded, 1.0)
    moved = (banded(x) - nope(x)).abs().amax(-1)
    assert bool((moved[:, 1:] > 1e-4).all())  # position 0 sees only itself: a bias there changes nothing


def test_a_layer_attends_as_the_reference_with_tau_on_q_and_r_past_the_training_length(monkeypatch):
    """Decoding queries 37..39 of a model trained at L = 16: q and r both times tau(n) = 1 + 0.1 log(n / 16),
    then the reference's banded attention over the 40 cached keys."""
    m = model(max_len=16)
    set_tables(m, 1.0)
    seen, attention = {}, posenc.attention

    def spy(q, k, v, **kw):
        seen.setdefault("out", attention(q, k, v, **kw))
        return seen["out"]

    block, rel = m.blocks[0], m.hidden_terms[0].module
    block.register_forward_pre_hook(lambda mod, args: seen.__setitem__("x", args[0]))
    cache, x = KVCache(2), ids(1, 40)
    m(x[:, :37], cache)
    seen.clear()
    monkeypatch.setattr(posenc, "attention", spy)
    m(x[:, 37:], cache)
    h = block.norm1(seen["x"])
    q = block.qkv(h).view(1, 3, 3, 2, 8).permute(2, 0, 3, 1, 4)[0]
    tau = torch.from_numpy(1 + 0.1 * np.log(np.arange(38, 41) / 16))[:, None]
    args = [t.detach().double() for t in (q, cache.k[0], cache.v[0], rel.states(h), rel.table)]
    want = R.banded_attention(args[0] * tau, args[1], args[2], args[3] * tau, args[4])
    np.testing.assert_allclose(seen["out"].detach().double().numpy(), want, rtol=1e-4, atol=1e-5)


def test_r_and_p_are_parameters_of_each_layer_and_the_scheme_trains_a_few_steps():
    m = model().train()
    before = [t.module.table.detach().clone() for t in m.hidden_terms]
    losses = train_hidden_terms(m)
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(not torch.equal(a, t.module.table) for a, t in zip(before, m.hidden_terms, strict=True))


def test_cached_decoding_past_the_training_length_equals_the_full_pass():
    m = model(max_len=16)
    set_tables(m, 1.0)
    x = ids(2, 48, seed=3)
    cache = KVCache(m.cfg.n_layer)
    steps = [m(x[:, :7], cache)] + [m(x[:, t : t + 1], cache) for t in range(7, 20)]
    steps += [m(x[:, t : t + 4], cache) for t in range(20, 48, 4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), m(x), rtol=1e-5, atol=1e-5)
    assert cache.state == [None, None]  # r is the new queries' only: the cache keeps nothing for it
    prompt = ids(1, 5, seed=4)
    cached = m.generate(prompt, 30, temperature=0)
    assert torch.equal(cached, m.generate(prompt, 30, temperature=0, use_cache=False))


def test_evaluates_at_16x_the_training_length():
    """At 512 = 16 x 32 tokens the attention runs on blocks of queries (past 2^18 scores)."""
    m = model(max_len=32)
    set_tables(m, 0.5)
    val = np.random.default_rng(0).integers(0, 256, 3000).astype(np.uint8)
    row = perplexities(m, val, [32, 512], train_len=32, max_tokens=1024)
    assert all(p is not None and math.isfinite(p) and p > 1 for p in row.ppl.values()), row.ppl
    assert row.note is None
