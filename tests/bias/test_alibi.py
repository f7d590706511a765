"""ALiBi module against posenc.reference."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import ALiBi, alibi_slopes
from posenc import reference as R


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 16, 20, 32])
def test_slopes_match_reference(n):
    np.testing.assert_allclose(alibi_slopes(n).numpy(), R.alibi_slopes(n), rtol=1e-7)
    np.testing.assert_allclose(ALiBi(n).slopes.numpy(), R.alibi_slopes(n), rtol=1e-7)


@given(st.integers(1, 12), st.integers(1, 40))
def test_bias_matches_reference(n_heads, seq):
    alibi = ALiBi(n_heads)
    np.testing.assert_allclose(
        alibi.bias(seq, causal=False).numpy(), R.alibi_bias(seq, n_heads, causal=False), atol=1e-5, rtol=1e-6
    )
    np.testing.assert_array_equal(
        np.isneginf(alibi.bias(seq).numpy()), np.isneginf(R.alibi_bias(seq, n_heads, causal=True))
    )


def test_bias_for_cached_queries_is_the_last_rows():
    alibi = ALiBi(4)
    torch.testing.assert_close(alibi.bias(3, 10), alibi.bias(10)[:, -3:])
    torch.testing.assert_close(alibi.bias(3, 10, causal=False), alibi.bias(10, causal=False)[:, -3:])


def test_bias_is_monotone_in_distance_and_defined_at_any_length():
    bias = ALiBi(8).bias(3000, causal=False)
    row = bias[:, 1500]
    assert torch.isfinite(bias).all()
    left, right = row[:, :1501], row[:, 1500:]
    assert (left.diff(dim=-1) > 0).all() and (right.diff(dim=-1) < 0).all()
    # offset 5 gets the same bias at position 3 and position 2995
    torch.testing.assert_close(bias[:, 8, 3], bias[:, 2999, 2994])


def test_learnable_slopes_train_and_stay_positive():
    alibi = ALiBi(4, learnable=True)
    opt = torch.optim.SGD(alibi.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        alibi.bias(6, causal=False).sum().neg().backward()  # pushes slopes towards zero
        opt.step()
    assert (alibi.slopes > 0).all()
    assert not torch.allclose(alibi.slopes, alibi_slopes(4))


def test_custom_slopes():
    alibi = ALiBi(2, slopes=[0.5, 0.1])
    np.testing.assert_allclose(alibi.bias(3, causal=False)[1, 0].numpy(), [0, -0.1, -0.2], atol=1e-7)


# ALiBi as a ScoreBias: its distance table is -m_h |d|; attention reaches its own kernel through the
# ScoreBias hook blocked_attention; checkpoints keep their keys.


def test_alibi_is_a_table_score_bias():
    from posenc import ScoreBias

    alibi = ALiBi(5)
    assert isinstance(alibi, ScoreBias) and not alibi.per_tile
    d = torch.arange(-6.0, 7.0)
    want = -R.alibi_slopes(5)[:, None] * np.abs(d.numpy())[None]
    np.testing.assert_allclose(alibi.table(d).numpy(), want, rtol=1e-6)
    tab = alibi.distance_table(7, causal=True)
    np.testing.assert_array_equal(np.isneginf(tab.numpy()), np.arange(13)[None, :].repeat(5, 0) < 6)
    np.testing.assert_allclose(tab[:, 6:].numpy(), want[:, 6:], rtol=1e-6)


@given(st.integers(1, 9), st.integers(1, 30), st.integers(0, 20), st.booleans(), st.booleans())
def test_alibi_bias_is_the_score_bias_of_its_table_bit_for_bit(n_heads, q_len, extra, causal, learnable):
    """ALiBi.bias (closed form, what attention's materialised path adds) and ScoreBias.bias (the generic
    lookup of its table -m_h |d|) are the same numbers, bit for bit, with the same slope gradients."""
    from posenc import ScoreBias

    alibi = ALiBi(n_heads, learnable=learnable)
    got = alibi.bias(q_len, q_len + extra, causal=causal)
    want = ScoreBias.bias(alibi, q_len, q_len + extra, causal=causal)
    assert torch.equal(got, want)
    if learnable:
        g = torch.randn(got.shape).masked_fill(torch.isinf(got), 0.0)
        (grad,) = torch.autograd.grad(got, alibi.log_slopes, g, allow_unused=True)
        (grad_want,) = torch.autograd.grad(want, alibi.log_slopes, g, allow_unused=True)
        # the generic lookup sums dS per distance before the slope's chain rule: the same terms g * b (b's
        # derivative in log m is b itself) in another float32 order, so they agree to rounding of their sum
        terms = (g * got.masked_fill(torch.isinf(got), 0.0)).abs().sum(dim=(1, 2))
        assert ((grad - grad_want).abs() <= 1e-5 * terms).all(), (grad, grad_want, terms)


def test_alibi_state_dict_keys_are_unchanged_and_old_checkpoints_load():
    assert list(ALiBi(4).state_dict()) == []  # fixed slopes are a non-persistent buffer
    assert list(ALiBi(4, learnable=True).state_dict()) == ["log_slopes"]
    # a model saved before ALiBi was a ScoreBias: a learnable ALiBi under the name "alibi"
    saved = {"alibi.log_slopes": torch.log(torch.tensor([0.5, 0.25, 0.125, 0.0625]))}
    model = torch.nn.Module()
    model.alibi = ALiBi(4, learnable=True)
    model.load_state_dict(saved, strict=True)
    np.testing.assert_allclose(model.alibi.slopes.detach().numpy(), [0.5, 0.25, 0.125, 0.0625], rtol=1e-6)
    fixed = torch.nn.Module()
    fixed.alibi = ALiBi(4)
    fixed.load_state_dict({}, strict=True)
    assert fixed.alibi.half().slopes.dtype == torch.float32  # the slopes keep their precision


@pytest.mark.parametrize("causal", [True, False])
def test_attention_runs_alibi_own_blocked_kernel(causal):
    """A prefill on the CPU runs ALiBi's own blocked kernel: attention(bias=ALiBi) is exactly it."""
    from posenc.attention import bias_backend
    from posenc.kernels.alibi_blocked import alibi_attention_blocked

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 300, 8, generator=gen)
    k, v = torch.randn(1, 2, 300, 8, generator=gen), torch.randn(1, 2, 300, 8, generator=gen)
    alibi = ALiBi(4)
    assert bias_backend(q, k, alibi) == "blocked"
    got = posenc.attention(q, k, v, bias=alibi, causal=causal)
    assert torch.equal(got, alibi_attention_blocked(q, k, v, alibi.slopes, causal=causal, scale=8**-0.5))
    assert torch.equal(alibi.blocked_attention(q, k, v, causal, 8**-0.5), got)


def test_attention_takes_a_score_bias_own_blocked_kernel():
    """The hook is what attention calls on the blocked path: a ScoreBias that overrides it is used."""
    from posenc import T5Bias
    from posenc.kernels.bias_blocked import bias_attention_blocked

    calls = []

    class Counted(T5Bias):
        def blocked_attention(self, q, k, v, causal, scale):
            calls.append((q.shape, causal, scale))
            return super().blocked_attention(q, k, v, causal, scale)

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 300, 8, generator=gen) for _ in range(3))
    bias = Counted(4)
    with torch.no_grad():  # a forward pass (training T5's table at 300 tokens would materialise it)
        got = posenc.attention(q, k, v, bias=bias, scale=0.5)
    assert calls == [((1, 4, 300, 8), True, 0.5)]
    assert torch.equal(got, bias_attention_blocked(q, k, v, bias, causal=True, scale=0.5))


def test_alibi_mask_mod_checks_its_lengths_as_every_score_bias():
    with pytest.raises(ValueError, match="k_len must be >= q_len"):
        ALiBi(2).mask_mod(5, 3)


def test_the_blocked_kernel_never_reuses_a_diagonal_mask_made_for_other_slopes():
    """The diagonal block's mask is memoised; slopes that changed in place (a training step) get a new one,
    equal to the materialised bias's attention."""
    alibi = ALiBi(4, learnable=True)
    q, k, v = (torch.randn(1, 4, 40, 8, dtype=torch.float64) for _ in range(3))

    def both():
        got = alibi.blocked_attention(q, k, v, True, 8**-0.5)
        mask = alibi.bias(40, 40, causal=True).to(torch.float64)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=8**-0.5)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)  # the bias is float32; a stale mask: 0.1

    both()
    with torch.no_grad():
        for p in alibi.parameters():
            p.mul_(3.0)
    both()
