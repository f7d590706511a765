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
    """One of each scheme with every parameter drawn from a seeded generator (deterministic whatever ran
    before), KERPLE's away from its clamps (where the straight-through gradient is not the finite difference)
    and FIRE's c and threshold off their initial values."""
    import torch

    gen = torch.Generator().manual_seed(n_heads)
    bias = {
        "t5": lambda: posenc.T5Bias(n_heads, num_buckets=8, max_distance=20),
        "t5-bidirectional": lambda: posenc.T5Bias(
            n_heads, num_buckets=8, max_distance=20, bidirectional=True
        ),
        "kerple-log": lambda: posenc.KerpleBias(n_heads, "log"),
        "kerple-power": lambda: posenc.KerpleBias(n_heads, "power"),
        "sandwich": lambda: posenc.SandwichBias(n_heads, 16),
        "fire": lambda: posenc.FireBias(n_heads, hidden=8, train_len=6),
    }[name]()
    with torch.no_grad():
        for _, p in sorted(bias.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=gen))
        if name.startswith("kerple"):
            bias.r1.copy_(0.2 + 1.2 * torch.rand(n_heads, generator=gen))
            bias.r2.copy_(0.2 + 1.2 * torch.rand(n_heads, generator=gen))
        if name == "fire":
            bias.threshold_multiplier.fill_(1.3)
            bias.c.fill_(0.4)
    return bias


NAMES = ["t5", "t5-bidirectional", "kerple-log", "kerple-power", "sandwich", "fire"]


def assert_same_gradients(got, want, params, atol: float = 1e-10) -> None:
    """The gradients of ``got`` and ``want`` (two computations of one output) with respect to ``params``
    agree to ``atol`` for one random float64 output gradient."""
    import torch

    grad = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=atol)
