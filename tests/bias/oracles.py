"""Each score bias's numpy oracle (posenc.reference) evaluated at a module's own parameters, and the
attention the oracle gives: the expected values of tests/bias and tests/kernels/test_bias_blocked.py."""

import numpy as np

import posenc
from posenc import reference as R


def oracle_bias(bias, q_len: int, k_len: int) -> np.ndarray:
    """(heads, q_len, k_len) float64 from posenc.reference, no causal mask, queries at the last positions."""
    if isinstance(bias, posenc.T5Bias):
        return R.t5_bias(q_len, k_len, bias.weight, bias.bidirectional, bias.num_buckets, bias.max_distance)
    if isinstance(bias, posenc.KerpleBias):
        r1, r2 = bias.coefficients()
        return R.kerple_bias(q_len, k_len, r1, r2, bias.kernel)
    if isinstance(bias, posenc.SandwichBias):
        return R.sandwich_bias(q_len, k_len, bias.n_heads, bias.dim)
    if isinstance(bias, posenc.FireBias):
        lin1, lin2 = bias.mlp[0], bias.mlp[2]
        return R.fire_bias(
            q_len,
            k_len,
            lin1.weight[:, 0],
            lin1.bias,
            lin2.weight,
            lin2.bias,
            float(bias.c.detach()),
            float(bias.threshold.detach()),
            bias.eps,
        )
    raise TypeError(type(bias).__name__)


def oracle_attention(q, k, v, bias, causal: bool, scale=None) -> np.ndarray:
    """posenc.reference.attention with the oracle's bias; k/v repeated for grouped-query attention."""
    g = q.shape[1] // k.shape[1]
    kk = np.repeat(k.double().numpy(), g, axis=1)
    vv = np.repeat(v.double().numpy(), g, axis=1)
    b = oracle_bias(bias, q.shape[2], k.shape[2])
    return R.attention(q.double().numpy(), kk, vv, bias=b, causal=causal, scale=scale)


def make_bias(name: str, n_heads: int):
    """One of each scheme, with parameters moved off their initial values where that could hide a bug."""
    import torch

    gen = torch.Generator().manual_seed(n_heads)
    if name == "t5":
        return posenc.T5Bias(n_heads, num_buckets=8, max_distance=20)
    if name == "t5-bidirectional":
        return posenc.T5Bias(n_heads, num_buckets=8, max_distance=20, bidirectional=True)
    if name in ("kerple-log", "kerple-power"):
        return posenc.KerpleBias(n_heads, name.split("-")[1])
    if name == "sandwich":
        return posenc.SandwichBias(n_heads, 16)
    if name == "fire":
        fire = posenc.FireBias(n_heads, hidden=8, train_len=6)
        with torch.no_grad():
            fire.mlp[2].weight.copy_(torch.randn(fire.mlp[2].weight.shape, generator=gen))
            fire.threshold_multiplier.fill_(1.3)
            fire.c.fill_(0.4)
        return fire
    raise KeyError(name)


NAMES = ["t5", "t5-bidirectional", "kerple-log", "kerple-power", "sandwich", "fire"]
