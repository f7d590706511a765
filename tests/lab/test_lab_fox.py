"""The fox scheme: the Forgetting Transformer (Lin et al. 2025), NoPE with a forget gate per head and layer
from the layer's normalised hidden state, through Encoding.hidden_terms and posenc.attention(bias=ForgetBias):
open gates are NoPE, the gates reach the attention as the reference computes it, they learn, cached
decoding keeps the gates and equals the full pass, and it evaluates at 16x its training length."""

import math

import numpy as np
import torch

from posenc import reference as R
from posenc.lab.config import GPTConfig
from posenc.lab.evaluate import perplexities
from posenc.lab.model import GPT, KVCache

from .conftest import train_hidden_terms


def model(encoding, seed=0, max_len=16, n_layer=2):
    torch.manual_seed(seed)
    cfg = GPTConfig(encoding=encoding, n_layer=n_layer, n_head=2, d_model=16, max_len=max_len)
    return GPT(cfg).eval()


def ids(batch, length, seed=1):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def set_gates(m, weight_std, bias):
    with torch.no_grad():
        for terms in m.hidden_terms:
            terms.module.proj.weight.normal_(std=weight_std, generator=torch.Generator().manual_seed(4))
            terms.module.proj.bias.fill_(bias)


def test_open_gates_are_nope_and_closing_them_moves_every_later_position():
    fox, nope = model("fox"), model("none")
    nope.load_state_dict({k: v for k, v in fox.state_dict().items() if not k.startswith("hidden_terms.")})
    x = ids(2, 12)
    set_gates(fox, 0.0, 40.0)  # log f = logsigmoid(40) = -4e-18: nothing forgotten
    torch.testing.assert_close(fox(x), nope(x), rtol=0, atol=1e-6)
    set_gates(fox, 0.0, -2.0)
    moved = (fox(x) - nope(x)).abs().amax(-1)
    assert bool((moved[:, 1:] > 1e-4).all())  # position 0 sees only itself: no decay to apply


def test_the_gate_reads_the_normalised_hidden_state_and_reaches_the_attention():
    """One layer by hand: q, k, v and the log-gates from RMSNorm(x), the reference's forgetting attention."""
    m = model("fox", n_layer=1)
    set_gates(m, 1.0, -1.0)
    x = ids(1, 10)
    block, gate = m.blocks[0], m.hidden_terms[0].module
    h = m.tok(x) * math.sqrt(16)
    n = block.norm1(h)
    q, k, v = block.qkv(n).view(1, 10, 3, 2, 8).permute(2, 0, 3, 1, 4)
    log_f = gate.proj(n).transpose(1, 2)
    log_f = -np.log1p(np.exp(-log_f.detach().double().numpy()))  # log sigmoid
    y = R.forgetting_attention(*(t.detach().double().numpy() for t in (q, k, v)), log_f)
    y = torch.from_numpy(y).float()
    h = h + block.proj(y.transpose(1, 2).reshape(1, 10, 16))
    h = h + block.mlp(block.norm2(h))
    torch.testing.assert_close(m(x), m.norm(h) @ m.tok.weight.T, rtol=1e-4, atol=1e-4)


def test_the_gates_are_parameters_of_each_layer_and_learn():
    m = model("fox").train()
    assert [k for k in m.state_dict() if k.startswith("hidden_terms.")] == [
        f"hidden_terms.{i}.module.proj.{p}" for i in (0, 1) for p in ("weight", "bias")
    ]
    assert all(bool((t.module.proj.bias == 0).all()) for t in m.hidden_terms)  # the authors' init
    losses = train_hidden_terms(m)
    assert losses[-1] < losses[0] - 0.1, losses
    assert any(bool((t.module.proj.bias != 0).any()) for t in m.hidden_terms)


def test_cached_decoding_keeps_the_gates_and_equals_the_full_pass():
    m = model("fox")
    set_gates(m, 0.5, -1.0)
    x = ids(2, 20, seed=3)
    cache = KVCache(m.cfg.n_layer)
    steps = [m(x[:, :7], cache)] + [m(x[:, t : t + 1], cache) for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), m(x), rtol=1e-5, atol=1e-5)
    # the first layer reads the token embeddings (NoPE adds nothing): its cached gates are theirs
    first = m.hidden_terms[0].module.log_gates(m.blocks[0].norm1(m.tok(x) * math.sqrt(16)))
    assert [tuple(s.log_forget.shape) for s in cache.state] == [(2, 2, 20)] * 2
    torch.testing.assert_close(cache.state[0].log_forget, first, rtol=0, atol=1e-6)
    prompt = ids(1, 5, seed=4)
    cached = m.generate(prompt, 8, temperature=0)
    assert torch.equal(cached, m.generate(prompt, 8, temperature=0, use_cache=False))


def test_evaluates_at_16x_the_training_length():
    """At 512 = 16 x 32 tokens the attention runs on blocks of queries (past 2^18 scores)."""
    m = model("fox", max_len=32)
    set_gates(m, 0.5, 1.0)
    val = np.random.default_rng(0).integers(0, 256, 3000).astype(np.uint8)
    row = perplexities(m, val, [32, 512], train_len=32, max_tokens=1024)
    assert all(p is not None and math.isfinite(p) and p > 1 for p in row.ppl.values()), row.ppl
    assert row.note is None
