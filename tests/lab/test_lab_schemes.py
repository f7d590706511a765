"""The laboratory's schemes beyond the classic five: every built-in trains, per-layer biases, randomized
positions (Ruoss et al. 2023) and the eval-time extensions bca (xPos) and temp (NoPE)."""

import copy
import math

import pytest
import torch

import posenc
from posenc.lab.config import GPTConfig
from posenc.lab.encodings import BUILTIN, EXTENSIONS, extensions_for
from posenc.lab.errors import LabError
from posenc.lab.model import GPT, KVCache, eval_extension


def tiny(encoding, max_len=16, n_layer=2):
    torch.manual_seed(0)
    return GPT(GPTConfig(encoding=encoding, n_layer=n_layer, n_head=2, d_model=16, max_len=max_len)).eval()


def ids(batch, length, seed=1):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scheme", BUILTIN)
def test_every_built_in_scheme_trains_and_is_causal(scheme):
    m = tiny(scheme).train()
    x = ids(2, 9)
    loss = m.loss(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in m.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    m.eval()
    if m.random_positions is not None:
        return  # its positions depend on the length, so a prefix is not a shorter sequence
    full = m(x)
    torch.testing.assert_close(m(x[:, :5]), full[:, :5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", [s for s in BUILTIN if s not in ("rope-random", "sinusoidal-random")])
def test_kv_cached_decoding_equals_the_full_forward(scheme):
    m = tiny(scheme)
    x = ids(2, 12, seed=3)
    cache = KVCache(m.cfg.n_layer)
    steps = [m(x[:, :7], cache)] + [m(x[:, t : t + 1], cache) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), m(x), rtol=1e-4, atol=1e-4)


def test_extensions_apply_to_their_schemes_only():
    assert extensions_for("rope", ("pi", "bca", "yarn", "temp")) == ["pi", "yarn"]
    assert extensions_for("xpos", tuple(EXTENSIONS)) == ["bca"]
    assert extensions_for("none", tuple(EXTENSIONS)) == ["temp"]
    assert extensions_for("alibi", tuple(EXTENSIONS)) == []
    with pytest.raises(
        LabError, match=r"extension='bca' applies to the schemes \['xpos'\]; this model is 'rope'"
    ):
        with eval_extension(tiny("rope"), "bca", 2.0, 8):
            pass


@pytest.mark.parametrize("scheme", ["shaw", "cope"])
def test_per_layer_biases_are_separate_modules_with_their_own_parameters(scheme):
    m = tiny(scheme, n_layer=3)
    assert m.score_bias is None and len(m.layer_biases) == 3
    params = [tuple(b.parameters()) for b in m.layer_biases]
    assert all(params) and len({id(p[0]) for p in params}) == 3
    names = [k for k in m.state_dict() if k.startswith("layer_biases.")]
    assert {k.split(".")[1] for k in names} == {"0", "1", "2"}


# ---------------------------------------------------------------------------------------------- randomized


@pytest.mark.parametrize("scheme", ["rope-random", "sinusoidal-random"])
def test_random_positions_are_sorted_distinct_and_within_the_range(scheme):
    m = tiny(scheme).train()
    assert m.random_positions == 16 * 16
    draws = [m._random_positions(8, "cpu") for _ in range(20)]
    for p in draws:
        assert p.shape == (8,) and len(set(p.tolist())) == 8
        assert bool((p[1:] > p[:-1]).all()) and 0 <= int(p[0]) and int(p[-1]) < 16 * 16
    assert len({tuple(p.tolist()) for p in draws}) > 1  # training draws change from batch to batch
    m.eval()
    assert torch.equal(m._random_positions(8, "cpu"), m._random_positions(8, "cpu"))  # evaluation repeats
    assert torch.equal(m._random_positions(300, "cpu"), torch.arange(300))  # longer than the range: all


@pytest.mark.parametrize(("scheme", "plain"), [("rope-random", "rope"), ("sinusoidal-random", "sinusoidal")])
def test_random_positions_over_a_range_of_t_are_the_ordinary_positions(scheme, plain):
    # with the range as long as the sequence the only sample is 0 .. T-1: the plain scheme's model exactly
    m, ref = tiny(scheme), tiny(plain)
    ref.load_state_dict(m.state_dict())
    m.random_positions = 1
    x = ids(2, 10)
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)


def test_random_positions_reach_the_encodings():
    # the rotary embedding sees the drawn positions: rotating q and k at them by hand gives the same logits
    m = tiny("rope-random", n_layer=1)
    x = ids(1, 6)
    positions = m._random_positions(6, "cpu")
    block = m.blocks[0]
    h = m.tok(x) * math.sqrt(16)
    q, k, v = block.qkv(block.norm1(h)).view(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
    layout = m.rotary.layout

    def rotate(t):
        rotated = posenc.reference.rope(
            t.detach().double().numpy(), positions.numpy(), m.cfg.rope_base, layout
        )
        return torch.from_numpy(rotated).float()

    q, k = rotate(q), rotate(k)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = h + block.proj(y.transpose(1, 2).reshape(1, 6, 16))
    h = h + block.mlp(block.norm2(h))
    expected = m.norm(h) @ m.tok.weight.T
    torch.testing.assert_close(m(x), expected, rtol=1e-4, atol=1e-4)


def test_random_positions_generate_without_a_cache_and_refuse_one():
    m = tiny("rope-random")
    out = m.generate(ids(1, 4), 3, temperature=0)
    assert out.shape == (1, 7)
    with pytest.raises(LabError, match="randomized positions cannot decode with a KV cache"):
        m(ids(1, 4), KVCache(m.cfg.n_layer))


# ---------------------------------------------------------------------------------------------- extensions


def test_bca_leaves_the_first_two_blocks_alone_and_changes_later_queries():
    # blockwise causal attention: a query in block b sees blocks b-1 and b, so queries in the first two
    # blocks still see every earlier key, and later ones lose the keys before the previous block
    m = tiny("xpos", max_len=8)
    x = ids(1, 20)
    plain = m(x)
    with eval_extension(m, "bca", 4.0, 8):
        assert m.attention_window == 4  # half the training length, as the paper's blocks
        windowed = m(x)
    assert m.attention_window is None
    torch.testing.assert_close(windowed[:, :8], plain[:, :8], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(windowed[:, 8:], plain[:, 8:], atol=1e-4)


def test_bca_with_a_cache_equals_bca_on_the_whole_sequence():
    m = tiny("xpos", max_len=4)
    x = ids(1, 14, seed=5)
    with eval_extension(m, "bca", 4.0, 4):
        full = m(x)
        cache = KVCache(m.cfg.n_layer)
        steps = [m(x[:, :6], cache)] + [m(x[:, t : t + 1], cache) for t in range(6, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-4)


def test_temp_multiplies_every_score_by_log_n_over_log_l():
    # multiplying the query projection by lambda multiplies every score by lambda: an independent model
    m = tiny("none")
    lam = math.log(4 * 8) / math.log(8)
    sharper = copy.deepcopy(m)
    with torch.no_grad():
        for block in sharper.blocks:
            block.qkv.weight[:16] *= lam
    x = ids(2, 12)
    with eval_extension(m, "temp", 4.0, 8):
        assert m.score_temperature == pytest.approx(lam)
        torch.testing.assert_close(m(x), sharper(x), rtol=1e-5, atol=1e-5)
    assert m.score_temperature == 1.0
    with eval_extension(m, "temp", 1.0, 8):
        assert m.score_temperature == 1.0  # no change within the training length
    with pytest.raises(LabError, match="train_len >= 2"):
        with eval_extension(m, "temp", 4.0, 1):
            pass
