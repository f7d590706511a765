"""posenc.lab.model: the GPT, KV-cached generation and eval-time RoPE extension."""

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc import PositionError
from posenc.lab.config import GPTConfig
from posenc.lab.errors import LabError
from posenc.lab.model import GPT, KVCache, rope_extension

SCHEMES = ["none", "sinusoidal", "learned", "rope", "alibi"]


def tiny(encoding, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(encoding=encoding, n_layer=2, n_head=2, d_model=16, max_len=kw.pop("max_len", 32), **kw)
    return GPT(cfg).eval()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_forward_shape_and_causality(scheme):
    m = tiny(scheme)
    idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    logits = m(idx)
    assert logits.shape == (2, 12, 256) and logits.dtype == torch.float32
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 256
    # a decoder: changing tokens 8.. leaves the logits at positions 0..7 alone
    torch.testing.assert_close(m(changed)[:, :8], logits[:, :8], rtol=0, atol=1e-5)
    assert not torch.allclose(m(changed)[:, 8:], logits[:, 8:])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cached_logits_equal_uncached(scheme):
    m = tiny(scheme)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    full = m(idx)
    cache = KVCache(m.cfg.n_layer)
    pieces = [m(idx[:, :7], cache)]  # a prompt, then one token at a time, then a chunk
    for t in range(7, 15):
        pieces.append(m(idx[:, t : t + 1], cache))
    pieces.append(m(idx[:, 15:], cache))
    assert cache.length == 20
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cached_generation_equals_uncached_generation(scheme):
    m = tiny(scheme)
    prompt = torch.tensor([[100, 101, 102, 32]])
    a = m.generate(prompt, 12, temperature=0, use_cache=True)
    b = m.generate(prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    s1 = m.generate(prompt, 10, temperature=1.0, top_k=20, generator=g1)
    s2 = m.generate(prompt, 10, temperature=1.0, top_k=20, generator=g2, use_cache=False)
    assert torch.equal(s1, s2)


def test_generation_matches_argmax_of_an_independent_forward():
    m = tiny("rope")
    prompt = torch.tensor([[1, 2, 3]])
    out = m.generate(prompt, 5, temperature=0)
    for t in range(3, 8):
        assert int(out[0, t]) == int(m(out[:, :t])[0, -1].argmax())


def test_loss_is_cross_entropy_of_the_logits():
    m = tiny("alibi")
    x = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(3))
    y = torch.roll(x, -1, 1)
    logp = torch.log_softmax(m(x).double(), -1)
    manual = -logp.gather(-1, y[..., None]).mean()
    assert math.isclose(m.loss(x, y).item(), manual.item(), rel_tol=1e-5)


def test_learned_past_its_table_raises_position_error():
    m = tiny("learned", max_len=8)
    m(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(PositionError, match="max_len=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_tied_embeddings_and_one_parameter_table():
    m = tiny("none")
    names = [n for n, _ in m.named_parameters()]
    assert "tok.weight" in names and not any("head" in n for n in names)
    learned = tiny("learned")
    assert sum(p.numel() for p in learned.parameters()) - sum(p.numel() for p in m.parameters()) == 32 * 16


def test_rope_scaling_changes_only_rope_and_is_undone():
    m = tiny("rope", max_len=8)
    idx = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(4))
    base = m(idx)
    m.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
    scaled = m(idx)
    assert not torch.allclose(scaled, base)
    m.set_rope_scaling(None)
    torch.testing.assert_close(m(idx), base, rtol=0, atol=0)
    with pytest.raises(LabError, match="rope"):
        tiny("alibi").set_rope_scaling({"rope_type": "linear", "factor": 2.0})


def test_linear_scaling_equals_rotating_at_divided_positions():
    # Independent check of PI (Chen et al. 2023): factor f rotates position p as p / f.
    m = tiny("rope", max_len=8)
    m.set_rope_scaling({"rope_type": "linear", "factor": 2.0})
    q = torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(0))
    k = torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(1))
    got_q, _ = m.rotary(q, k)
    plain = posenc.RotaryEmbedding(8)
    want_q = plain.rotate(q, positions=torch.arange(6, dtype=torch.float64) / 2)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)


def test_negative_temperature_is_rejected():
    with pytest.raises(LabError, match="temperature"):
        tiny("none").generate(torch.tensor([[1]]), 1, temperature=-1)


@pytest.mark.parametrize("d_model", [16, 128])
def test_untrained_model_is_near_uniform_even_on_the_current_byte(d_model):
    # Tied embeddings must not start out confidently predicting "repeat the current byte".
    torch.manual_seed(0)
    m = GPT(GPTConfig(encoding="sinusoidal", n_layer=1, n_head=2, d_model=d_model, max_len=16))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(9))
    y = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(10))
    on_self = F.cross_entropy(m(x).reshape(-1, 256), x.reshape(-1)).item()
    on_random = F.cross_entropy(m(x).reshape(-1, 256), y.reshape(-1)).item()
    assert abs(on_random - math.log(256)) < 0.5
    assert on_self > math.log(256) - 3.5


def test_state_dict_names_each_encoding_module_once():
    # Checkpoints store these keys; the encoding's modules are children under one name each.
    def outside_blocks(m):
        return [k for k in m.state_dict() if not k.startswith("blocks.")]

    assert outside_blocks(tiny("learned")) == ["tok.weight", "pos_input.weight", "norm.weight"]
    for scheme in ("none", "sinusoidal", "rope", "alibi"):
        assert outside_blocks(tiny(scheme)) == ["tok.weight", "norm.weight"]


def test_cached_decoding_rotates_every_key_with_the_current_schedule():
    # Keys are cached unrotated, so under dynamic NTK (whose frequencies change with the context) cached
    # logits still equal a fresh forward over the whole prefix; keys rotated once when new would not.
    m = tiny("rope", max_len=8)
    idx = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(6))
    with rope_extension(m, "dynamic", 3.0, 8):
        cache = KVCache(m.cfg.n_layer)
        cached = [m(idx[:, :4], cache)] + [m(idx[:, t : t + 1], cache) for t in range(4, 24)]
        fresh = [m(idx[:, :4])] + [m(idx[:, : t + 1])[:, -1:] for t in range(4, 24)]
    torch.testing.assert_close(torch.cat(cached, 1), torch.cat(fresh, 1), rtol=0, atol=1e-6)


def test_rope_extension_applies_inside_and_puts_the_original_back():
    m = tiny("rope", max_len=8)
    original = m.rotary
    idx = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(4))
    base = m(idx)
    with rope_extension(m, "pi", 4.0, 8) as same:
        assert same is m and m.rotary is not original and m.rotary.scaling is not None
        scaled = m(idx)
    assert m.rotary is original
    torch.testing.assert_close(m(idx), base, rtol=0, atol=0)
    m.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(m(idx), scaled, rtol=0, atol=0)


def test_rope_extension_changes_nothing_within_the_training_length_or_without_a_method():
    m = tiny("rope", max_len=8)
    original = m.rotary
    with rope_extension(m, "yarn", 1.0, 8):
        assert m.rotary is original
    alibi = tiny("alibi")
    with rope_extension(alibi, None, 4.0, 8):
        assert alibi.rotary is None


def test_rope_extension_restores_after_an_error_and_checks_its_arguments():
    m = tiny("rope", max_len=8)
    original = m.rotary
    with pytest.raises(RuntimeError, match="boom"), rope_extension(m, "ntk", 2.0, 8):
        raise RuntimeError("boom")
    assert m.rotary is original
    with pytest.raises(
        LabError, match="extension='rerope' is not known; allowed: pi, ntk, dynamic, yarn, bca"
    ):
        with rope_extension(m, "rerope", 2.0, 8):
            pass
    with pytest.raises(
        LabError, match=r"extension='pi' applies to the schemes \['rope'\]; this model is 'alibi'"
    ):
        with rope_extension(tiny("alibi"), "pi", 2.0, 8):
            pass
