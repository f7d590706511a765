"""posenc.attention and its ALiBi and score-bias paths against the materialised-bias reference (numpy and
torch)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import ALiBi, RotaryEmbedding, reference
from posenc.attention import DECODE_QUERIES, alibi_backend, bias_backend
from posenc.kernels import rotate_eager
from posenc.kernels.alibi_blocked import alibi_attention_blocked

from .bias.oracles import NAMES, make_bias, oracle_attention
from .peak_memory import peak_rise_mib


def _materialised(q, k, v, alibi, causal, scale=None):
    """SDPA with the (heads, q_len, k_len) bias built in full, k/v expanded for GQA: the torch reference."""
    g = q.shape[1] // k.shape[1]
    mask = alibi.bias(q.shape[2], k.shape[2], causal=causal).to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask, scale=scale
    )


def _numpy_reference(q, k, v, slopes, causal):
    """posenc.reference.attention with ALiBi's bias, queries at the last q_len positions."""
    lq, lk = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    i = np.arange(lk - lq, lk)[:, None]
    j = np.arange(lk)[None, :]
    bias = -np.asarray(slopes, dtype=np.float64)[:, None, None] * np.abs(i - j)[None]
    kk = np.repeat(k.double().numpy(), g, axis=1)
    vv = np.repeat(v.double().numpy(), g, axis=1)
    return reference.attention(q.double().numpy(), kk, vv, bias=bias, causal=causal)


@st.composite
def alibi_case(draw):
    batch = draw(st.integers(1, 2))
    kv_heads = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    k_len = draw(st.integers(1, 40))
    q_len = draw(st.integers(1, k_len))
    head_dim = draw(st.sampled_from([4, 8, 12]))
    v_dim = draw(st.sampled_from([head_dim, 6]))
    causal = draw(st.booleans())
    block = draw(st.integers(1, 16))
    return batch, kv_heads * group, kv_heads, q_len, k_len, head_dim, v_dim, causal, block


@given(alibi_case())
def test_blocked_matches_reference_float32(case):
    b, h, hk, lq, lk, d, dv, causal, block = case
    gen = torch.Generator().manual_seed(lq * 100 + lk)
    q, k, v = (
        torch.randn(b, h, lq, d, generator=gen),
        torch.randn(b, hk, lk, d, generator=gen),
        torch.randn(b, hk, lk, dv, generator=gen),
    )
    alibi = ALiBi(h)
    got = alibi_attention_blocked(q, k, v, alibi.slopes, causal=causal, block=block)
    want = _numpy_reference(q, k, v, alibi.slopes.double().numpy(), causal)
    np.testing.assert_allclose(got.double().numpy(), want, atol=1e-5, rtol=0)


@given(alibi_case())
def test_blocked_gradients_match_materialised_float64(case):
    b, h, hk, lq, lk, d, dv, causal, block = case
    gen = torch.Generator().manual_seed(lq * 7 + lk)
    q = torch.randn(b, h, lq, d, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, hk, lk, d, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, hk, lk, dv, generator=gen, dtype=torch.float64, requires_grad=True)
    alibi = ALiBi(h, learnable=True).double()
    got = alibi_attention_blocked(q, k, v, alibi.slopes, causal=causal, block=block)
    want = _materialised(q, k, v, alibi, causal)
    grad = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    params = (q, k, v, alibi.log_slopes)
    for g, w in zip(
        torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad), strict=True
    ):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_blocked_gradcheck(causal):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 9, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.5, 0.125], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: alibi_attention_blocked(*a, causal=causal, scale=0.7, block=4), (q, k, v, slopes)
    )


def test_long_context_precision_float32():
    """Past the block size the appended (j - base) values stay small near the diagonal: still 1e-5 at L =
    1500."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1500, 16, generator=gen) for _ in range(3))
    alibi = ALiBi(2)  # slopes 1/2 and 1/16: the steepest bias, the largest appended values
    got = alibi_attention_blocked(q, k, v, alibi.slopes, causal=True)
    want = _materialised(q.double(), k.double(), v.double(), alibi.double(), True)
    assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("shape", [(2, 4, 8, 16), (1, 8, 300, 16)])  # materialised and blocked paths
def test_attention_alibi_dispatch_matches_reference(shape):
    b, h, seq, d = shape
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, seq, d, generator=gen)
    k, v = torch.randn(b, h // 2, seq, d, generator=gen), torch.randn(b, h // 2, seq, d, generator=gen)
    alibi = ALiBi(h)
    expect = "materialise" if seq < DECODE_QUERIES else "blocked"
    assert alibi_backend(q, k, alibi) == expect
    got = posenc.attention(q, k, v, bias=alibi, causal=True)
    want = _numpy_reference(q, k, v, alibi.slopes.double().numpy(), True)
    np.testing.assert_allclose(got.double().numpy(), want, atol=1e-5, rtol=0)


def test_attention_alibi_kv_cache_decoding_bottom_right():
    """Decoding: the last 3 queries of 40 positions see exactly what full causal attention gives those
    rows."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, 40, 8, generator=gen) for _ in range(3))
    alibi = ALiBi(4)
    full = posenc.attention(q, k, v, bias=alibi, causal=True)
    last = posenc.attention(q[:, :, -3:], k, v, bias=alibi, causal=True)
    torch.testing.assert_close(last, full[:, :, -3:], rtol=0, atol=1e-6)
    blocked = alibi_attention_blocked(q[:, :, -3:], k, v, alibi.slopes, causal=True, block=2)
    torch.testing.assert_close(blocked, full[:, :, -3:], rtol=0, atol=1e-6)


def test_attention_alibi_learnable_slopes_train_on_blocked_path():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 300, 8, generator=gen, requires_grad=True) for _ in range(3))
    alibi = ALiBi(4, learnable=True)
    assert alibi_backend(q, k) == "blocked"
    out = posenc.attention(q, k, v, bias=alibi)
    out.square().sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    alibi2 = ALiBi(4, learnable=True)
    _materialised(q2, k2, v2, alibi2, True).square().sum().backward()
    for a, b_ in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b_.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(alibi.log_slopes.grad, alibi2.log_slopes.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("causal,q_len", [(True, 9), (True, 3), (False, 9)])
def test_flex_score_mod_matches_materialised(causal, q_len):
    """The score_mod the CUDA path compiles, run by FlexAttention's eager (unfused) CPU implementation."""
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, q_len, 8, generator=gen)
    k, v = torch.randn(2, 2, 9, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen)
    alibi = ALiBi(4)
    got = flex_attention(q, k, v, score_mod=alibi.score_mod(q_len, 9, causal), enable_gqa=True)
    torch.testing.assert_close(got, _materialised(q, k, v, alibi, causal), rtol=0, atol=1e-5)


def test_alibi_mask_mod_is_bottom_right_causal():
    mask_mod = ALiBi(2).mask_mod(3, 5)
    qi, kj = torch.arange(3)[:, None], torch.arange(5)[None, :]
    assert torch.equal(mask_mod(0, 0, qi, kj), ALiBi(2).distance(3, 5) >= 0)


def test_attention_rotary_matches_manual_rotation_and_sdpa():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (
        torch.randn(2, 4, 7, 16, generator=gen),
        torch.randn(2, 2, 7, 16, generator=gen),
        torch.randn(2, 2, 7, 16, generator=gen),
    )
    rope = RotaryEmbedding(16, layout="half")
    positions = torch.arange(3, 10)
    got = posenc.attention(q, k, v, rotary=rope, positions=positions)
    cos, sin = rope.cos_sin(7, positions)
    qr, kr = rotate_eager(q, cos, sin, "half"), rotate_eager(k, cos, sin, "half")
    want = F.scaled_dot_product_attention(
        qr, kr.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_blocked_alibi_memory_stays_linear():
    """Forward and backward at L = 4096, 4 heads: a materialised bias alone would be 256 MiB; the peak RSS
    rise of the blocked path must stay under 100 MiB (its buffers are O(L * head_dim))."""
    setup = (
        "from posenc.kernels.alibi_blocked import alibi_attention_blocked; slopes = posenc.ALiBi(4).slopes"
    )
    rise_mib = peak_rise_mib(setup, "alibi_attention_blocked(q, k, v, slopes)", 4096)
    assert rise_mib < 100, f"peak RSS rose by {rise_mib:.0f} MiB"


def test_attention_alibi_errors():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="n_heads=3"):
        posenc.attention(q, q, q, bias=ALiBi(3))
    with pytest.raises(ValueError, match="q_len <= k_len"):
        posenc.attention(q, q[:, :, :2], q[:, :, :2], bias=ALiBi(2), causal=False)
    assert math.isfinite(float(posenc.attention(q, q, q, bias=ALiBi(2), causal=False).sum()))


def test_blocked_errors_name_the_argument():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    slopes = ALiBi(4).slopes
    with pytest.raises(ValueError, match=r"slopes must be a tensor of shape \(4,\), got \(3,\)"):
        alibi_attention_blocked(q, k, k, slopes[:3])
    with pytest.raises(ValueError, match="block must be an integer >= 1, got 0"):
        alibi_attention_blocked(q, k, k, slopes, block=0)
    with pytest.raises(ValueError, match="q_len must be <= k_len"):
        alibi_attention_blocked(q, k[:, :, :3], k[:, :, :3], slopes)
    with pytest.raises(ValueError, match="kv_heads dividing heads"):
        alibi_attention_blocked(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), slopes)
    with pytest.raises(ValueError, match="v must be a floating tensor"):
        alibi_attention_blocked(q, k, k[0], slopes)


def _rope_reference(q, k, v, q_pos, k_pos, allowed, layout="half"):
    """numpy: rotate q and k at their positions (posenc.reference.rope), then softmax over allowed keys."""
    qr = reference.rope(q.double().numpy(), q_pos, layout=layout)
    kr = reference.rope(k.double().numpy(), k_pos, layout=layout)
    g = q.shape[1] // k.shape[1]
    kr, vv = np.repeat(kr, g, axis=1), np.repeat(v.double().numpy(), g, axis=1)
    scores = qr @ kr.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    scores = np.where(allowed, scores, -np.inf)
    return reference.softmax(scores) @ vv


@pytest.mark.parametrize("offset", [0, 7])
@pytest.mark.parametrize("q_len", [1, 3])
def test_rope_decoding_queries_take_the_last_positions(q_len, offset):
    """q holds the last q_len tokens, k the whole cache (unrotated): equal to the full pass, sliced."""
    rope = RotaryEmbedding(16, layout="half")
    gen = torch.Generator().manual_seed(q_len + offset)
    q, k, v = (torch.randn(2, h, 12, 16, generator=gen) for h in (4, 2, 2))
    full = posenc.attention(q, k, v, rotary=rope, offset=offset)
    step = posenc.attention(q[:, :, -q_len:], k, v, rotary=rope, offset=offset)
    torch.testing.assert_close(step, full[:, :, -q_len:], rtol=0, atol=2e-6)
    pos = offset + np.arange(12)
    allowed = pos[-q_len:, None] >= pos[None, :]
    want = _rope_reference(q[:, :, -q_len:], k, v, pos[-q_len:], pos, allowed)
    np.testing.assert_allclose(step.double().numpy(), want, atol=2e-5)


def test_batched_decoding_with_left_padding_equals_each_sequence_alone():
    """Per-sequence positions for q and for k plus a boolean padding mask: each row of the batch gives what
    that sequence gives unpadded."""
    rope = RotaryEmbedding(16, layout="interleaved")
    lengths, total = [9, 5], 9
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, total, 16, generator=gen) for h in (4, 2, 2))
    pad = torch.tensor([total - n for n in lengths])
    k_pos = (torch.arange(total)[None] - pad[:, None]).clamp(min=0)  # left padding sits at position 0
    keep = torch.arange(total)[None] >= pad[:, None]  # (batch, k_len): True for real tokens
    mask = keep[:, None, None, :]  # (batch, 1, 1, k_len), broadcast over heads and queries
    out = posenc.attention(
        q[:, :, -1:], k, v, rotary=rope, positions=k_pos[:, -1:], k_positions=k_pos, bias=mask
    )
    for b, n in enumerate(lengths):
        alone = posenc.attention(
            q[b : b + 1, :, -n:], k[b : b + 1, :, -n:], v[b : b + 1, :, -n:], rotary=rope
        )
        torch.testing.assert_close(out[b : b + 1], alone[:, :, -1:], rtol=0, atol=2e-6)


def test_boolean_bias_means_may_attend_as_in_sdpa():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    allowed = torch.rand(1, 2, 6, 6, generator=gen) > 0.3
    allowed[..., 0] = True
    got = posenc.attention(q, k, v, bias=allowed, causal=False)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
    # causal and a boolean mask combine; a row that may attend to nothing gives zeros, never NaN
    allowed[0, 0, 3] = False
    got = posenc.attention(q, k, v, bias=allowed, causal=True)
    assert torch.isfinite(got).all() and torch.equal(got[0, 0, 3], torch.zeros(8))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed & causal)
    torch.testing.assert_close(got[0, 1], want[0, 1])
    with pytest.raises(ValueError, match=r"bias must be a boolean mask .* got dtype torch.int64"):
        posenc.attention(q, k, v, bias=allowed.long())


@pytest.mark.parametrize("scheme", ["none", "rope", "alibi"])
def test_empty_queries_give_empty_output_for_every_scheme(scheme):
    q, k = torch.randn(1, 2, 0, 8), torch.randn(1, 2, 0, 8)
    kwargs = {"rope": {"rotary": RotaryEmbedding(8)}, "alibi": {"bias": ALiBi(2)}, "none": {}}[scheme]
    out = posenc.attention(q, k, torch.randn(1, 2, 0, 4), **kwargs)
    assert out.shape == (1, 2, 0, 4)


# --- score biases (T5, KERPLE, Sandwich, FIRE): one protocol, one blocked kernel ----------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(2, 4, 8, 16), (1, 4, 300, 8)])  # materialised and blocked paths
def test_attention_score_bias_dispatch_matches_reference(name, shape):
    b, h, seq, d = shape
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, seq, d, generator=gen)
    k, v = torch.randn(b, h // 2, seq, d, generator=gen), torch.randn(b, h // 2, seq, d, generator=gen)
    bias = make_bias(name, h)
    with torch.no_grad():  # a forward pass: training a bias's parameters may materialise longer ones
        assert bias_backend(q, k, bias) == ("materialise" if seq < DECODE_QUERIES else "blocked")
        got = posenc.attention(q, k, v, bias=bias, scale=1.0 if name.startswith("t5") else None)
    want = oracle_attention(q, k, v, bias, True, scale=1.0 if name.startswith("t5") else None)
    np.testing.assert_allclose(got.detach().double().numpy(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal,q_len", [(True, 9), (True, 3), (False, 9), (False, 3)])
def test_score_mod_on_index_tensors_equals_bias(name, causal, q_len):
    """The score_mod the CUDA path compiles, evaluated on broadcast index tensors, against .bias()."""
    bias = make_bias(name, 3)
    mod = bias.score_mod(q_len, 9, causal)
    h, qi, kj = (
        torch.arange(3)[:, None, None],
        torch.arange(q_len)[None, :, None],
        torch.arange(9)[None, None],
    )
    got = mod(torch.zeros(3, q_len, 9), torch.tensor(0), h, qi, kj)
    torch.testing.assert_close(got, bias.bias(q_len, 9, causal=causal), rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["t5", "kerple-power", "fire"])
def test_flex_score_mod_of_score_biases_matches_materialised(name):
    """FlexAttention's eager CPU implementation (vmap over the indices) with each score_mod."""
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 3, 8, generator=gen)
    k, v = torch.randn(2, 2, 9, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen)
    bias = make_bias(name, 4)
    with torch.no_grad():
        got = flex_attention(q, k, v, score_mod=bias.score_mod(3, 9, True), enable_gqa=True)
        torch.testing.assert_close(got, _materialised(q, k, v, bias, True), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["t5", "kerple-log", "sandwich", "fire"])
def test_score_bias_kv_cache_decoding_bottom_right(name):
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, 80, 8, generator=gen) for _ in range(3))
    bias = make_bias(name, 4)
    full = posenc.attention(q, k, v, bias=bias)
    for q_len in (1, 3, 70):  # materialised, materialised, blocked
        last = posenc.attention(q[:, :, -q_len:], k, v, bias=bias)
        torch.testing.assert_close(last, full[:, :, -q_len:], rtol=0, atol=2e-6)


def test_score_bias_errors_and_empty_queries():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="KerpleBias has n_heads=3, but q has 2 heads"):
        posenc.attention(q, q, q, bias=posenc.KerpleBias(3))
    with pytest.raises(ValueError, match="T5Bias needs q_len <= k_len"):
        posenc.attention(q, q[:, :, :2], q[:, :, :2], bias=posenc.T5Bias(2), causal=False)
    with pytest.raises(ValueError, match="bias must be an ALiBi module, a ScoreBias"):
        posenc.attention(q, q, q, bias="t5")
    empty = torch.randn(1, 2, 0, 8)
    assert posenc.attention(empty, empty, empty, bias=posenc.SandwichBias(2)).shape == (1, 2, 0, 8)


@pytest.mark.parametrize("shape", [(5, 6), (3, 5, 5), (2, 2, 5, 5), (1, 3, 5, 5)])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_a_mask_of_the_wrong_shape_is_refused_naming_bias_and_the_shape(shape, dtype):
    """A raw broadcast error from SDPA named neither the argument nor the shape it must have."""
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(
        ValueError, match=r"bias must broadcast to \(batch, heads, q_len, k_len\) = \(1, 2, 5, 5\)"
    ):
        posenc.attention(q, q, q, bias=torch.zeros(shape, dtype=dtype))


def test_the_materialised_bias_is_taken_where_it_measured_faster():
    """The blocked kernels win whenever a block of queries has work to do; materialising wins for a few
    queries (decoding) and while a bias's parameters train at short lengths, within SDPA's score memory."""
    from posenc import T5Bias
    from posenc.attention import bias_backend

    t5 = T5Bias(8)
    lab, long = torch.randn(16, 8, 64, 16), torch.randn(1, 8, 4096, 64)
    assert bias_backend(lab, lab, t5) == "materialise"  # training T5's table at the lab's shape
    with torch.no_grad():
        assert bias_backend(lab, lab, t5) == "blocked"  # forward only: nothing to train
    assert bias_backend(lab, lab, posenc.SandwichBias(8)) == "blocked"  # no parameters
    assert bias_backend(lab, lab, ALiBi(8, learnable=True)) == "blocked"  # its kernel gives the slopes' grad
    assert bias_backend(torch.randn(16, 8, 256, 16), torch.randn(16, 8, 256, 16), t5) == "blocked"
    assert bias_backend(torch.randn(16, 8, 1, 64), torch.randn(16, 8, 4096, 64), t5) == "materialise"
    assert bias_backend(long[:, :, -1:], long, t5) == "materialise"  # one decode step
    assert bias_backend(torch.randn(64, 32, 1, 8), torch.randn(64, 32, 65536, 8), t5) == "blocked"  # memory
    assert bias_backend(long, long, t5) == "blocked"


@pytest.mark.filterwarnings("ignore")
def test_the_flex_path_compiles_once_for_every_length():
    """The CUDA bias path compiled flex_attention with dynamic=False: each new key length recompiled, and
    after 8 dynamo fell back to the unfused path that materialises the scores (token-by-token decoding lost
    O(L) memory). Driven on the CPU (forward), where the compiler behaves the same."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from posenc.attention import _flex_attention

    torch._dynamo.reset()
    counters.clear()
    alibi = ALiBi(2)
    with torch.no_grad():
        for seq in (64, 80, 96):
            q = torch.randn(1, 2, seq, 16)
            out = _flex_attention(q, q, q, alibi, True, 0.25, False)
            want = F.scaled_dot_product_attention(
                q, q, q, attn_mask=alibi.bias(seq, seq, causal=True), scale=0.25
            )
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("interleaved", [False, True])
def test_multimodal_rope_attention_matches_the_oracle(interleaved):
    """attention(rotary=MRotaryEmbedding) was refused without a word in the docs [issue 19 D7]: queries
    at (3, batch, q_len) positions, keys at their own, causal, against numpy's M-RoPE and attention in
    float64."""
    from posenc import reference as R

    section = (2, 1, 1)
    mrope = posenc.MRotaryEmbedding(8, section, interleaved=interleaved)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    t = torch.arange(7).expand(2, -1)
    k_pos = torch.stack((t, t // 2 + 1, t % 3))  # an image-like grid: the axes differ
    q_pos = k_pos[..., 4:]
    got = posenc.attention(q, k, v, rotary=mrope, positions=q_pos, k_positions=k_pos)
    rq = R.mrope(q.numpy(), q_pos.numpy(), section, interleaved=interleaved)
    rk = R.mrope(k.numpy(), k_pos.numpy(), section, interleaved=interleaved)
    want = R.attention(rq, np.repeat(rk, 2, axis=1), np.repeat(v.numpy(), 2, axis=1), causal=True)
    assert np.abs(got.numpy() - want).max() < 1e-10
    with pytest.raises(ValueError, match="k_positions"):
        posenc.attention(q, k, v, rotary=mrope, positions=q_pos)
    with pytest.raises(ValueError, match="needs positions"):
        posenc.attention(q, k, v, rotary=mrope)
