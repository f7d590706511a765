"""RotaryEmbedding with context-extension scaling: against posenc.reference.rope, at far positions, per
sequence,
and token-by-token decoding through RotaryKVCache against a full forward pass."""

import math

import numpy as np
import pytest
import torch

from posenc import RotaryEmbedding
from posenc import reference as R
from posenc.rope.cache import RotaryKVCache
from posenc.rope.frequencies import rope_frequencies

ORIG = 64
HEAD_DIM = 32
LONG = np.linspace(1.0, 6.0, HEAD_DIM // 2).tolist()
SHORT = np.linspace(1.0, 1.3, HEAD_DIM // 2).tolist()

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 8.0},
    "ntk": {"rope_type": "ntk", "factor": 8.0},
    "dynamic": {"rope_type": "dynamic", "factor": 8.0},
    "yarn": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": ORIG},
    "dynamic_yarn": {"rope_type": "dynamic_yarn", "original_max_position_embeddings": ORIG},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIG,
        "rope_theta": 5e5,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": SHORT,
        "long_factor": LONG,
        "original_max_position_embeddings": ORIG,
        "factor": 16.0,
    },
    "proportional": {"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5},
}


def rotary(name, layout="half"):
    return RotaryEmbedding(HEAD_DIM, layout=layout, scaling=SCALINGS[name], max_position_embeddings=ORIG)


def expected(x, positions, name, layout, context_len):
    """float64 numpy reference with the schedule posenc.rope.frequencies gives for that context length."""
    inv, attn = rope_frequencies(
        HEAD_DIM,
        scaling=SCALINGS[name],
        max_position_embeddings=ORIG,
        seq_len=context_len,
        dtype=torch.float64,
    )
    base = (SCALINGS[name] or {}).get("rope_theta", 1e4)
    return R.rope(
        x.double().numpy(), positions, base=base, layout=layout, inv_freq=inv.numpy(), attention_factor=attn
    )


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("start", [10**6, 3 * 10**6 + 17, 10**7 - 5])
def test_far_positions_match_float64_reference(name, layout, start):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, HEAD_DIM)
    positions = torch.arange(start, start + 5)
    rot = rotary(name, layout)
    got = rot.rotate(x, positions)
    want = expected(x, positions.numpy(), name, layout, start + 5)
    err = np.abs(got.numpy() - want).max()
    assert err <= 1e-5, err
    got_offset = rot.rotate(x, offset=start)  # the positions=None path
    assert np.abs(got_offset.numpy() - want).max() <= 1e-5
    # naive float32 angles are far off here: this test could fail
    naive = positions.float()[:, None] * rot.frequencies(start + 5)[0].float()
    assert (naive.double() - positions.double()[:, None] * rot.frequencies(start + 5)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["dynamic", "dynamic_yarn", "longrope"])
def test_length_dependent_methods_follow_the_sequence(name):
    torch.manual_seed(1)
    rot = rotary(name)
    for seq in (ORIG // 2, ORIG, 3 * ORIG):
        x = torch.randn(1, 2, seq, HEAD_DIM)
        got = rot.rotate(x)
        want = expected(x, np.arange(seq), name, "half", seq)
        assert np.abs(got.numpy() - want).max() <= 1e-5
    short = expected(x, np.arange(3 * ORIG), name, "half", ORIG)  # the schedule below the original length
    assert np.abs(got.numpy() - short).max() > 1e-2  # scaling did kick in


def test_per_sequence_factors():
    torch.manual_seed(2)
    rot = rotary("yarn")
    x = torch.randn(3, 2, 7, HEAD_DIM)
    positions = torch.arange(100, 107)
    factors = torch.tensor([1.0, 4.0, 32.0])
    got = rot.rotate(x, positions, factor=factors)
    for i, f in enumerate(factors.tolist()):
        scaling = {**SCALINGS["yarn"], "factor": f}
        inv, attn = rope_frequencies(HEAD_DIM, scaling=scaling, dtype=torch.float64)
        want = R.rope(
            x[i].double().numpy(),
            positions.numpy(),
            layout="half",
            inv_freq=inv.numpy(),
            attention_factor=attn,
        )
        assert np.abs(got[i].numpy() - want).max() <= 1e-5
        single = rot.rotate(x[i : i + 1], positions, factor=f)
        assert torch.allclose(single[0], got[i], atol=1e-6)
    assert (got[0] - got[2]).abs().max() > 1e-2
    q, k = rot(x, x, positions, factor=factors)
    assert torch.equal(q, got) and torch.equal(k, got)


def test_dynamic_is_per_sequence_in_a_batch():
    # each sequence gets the schedule for its own length: a batch never changes a sequence's rotation
    torch.manual_seed(3)
    rot = rotary("dynamic")
    x = torch.randn(2, 2, 4, HEAD_DIM)
    positions = torch.stack((torch.arange(10, 14), torch.arange(500, 504)))
    got = rot.rotate(x, positions)
    for i in range(2):
        want = expected(x[i], positions[i].numpy(), "dynamic", "half", int(positions[i].max()) + 1)
        assert np.abs(got[i].numpy() - want).max() <= 1e-5
        assert torch.allclose(rot.rotate(x[i : i + 1], positions[i]), got[i : i + 1], atol=1e-6)
    whole_batch = rot.rotate(x, positions, context_len=504)  # transformers' choice: the batch maximum
    assert (whole_batch[0] - got[0]).abs().max() > 1e-3


def test_factor_errors():
    with pytest.raises(ValueError, match="factor"):
        rotary("default").rotate(torch.randn(1, 1, 3, HEAD_DIM), factor=2.0)
    with pytest.raises(ValueError, match="factor"):
        rotary("longrope").rotate(torch.randn(1, 1, 3, HEAD_DIM), factor=2.0)
    with pytest.raises(ValueError, match="factor"):
        rotary("yarn").rotate(torch.randn(2, 1, 3, HEAD_DIM), factor=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="factor"):
        rotary("yarn").rotate(torch.randn(1, 1, 3, HEAD_DIM), factor=0.5)


def test_scaling_dict_theta_and_partial_rotary():
    rot = RotaryEmbedding(
        64, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5, "partial_rotary_factor": 0.5}
    )
    assert rot.rotary_dim == 32 and rot.base == 5e5
    np.testing.assert_allclose(rot.inv_freq.numpy(), R.inverse_frequencies(32, 5e5) / 2, rtol=1e-6)
    with pytest.raises(ValueError, match="rotary_dim"):
        RotaryEmbedding(
            64, rotary_dim=16, scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}
        )


# ------------------------------------------------------------------------------ KV cache consistency
def one_layer(x, rot, w, cache=None):
    """Single-head causal attention; with a cache, x holds the new tokens only."""
    q, k, v = (x @ wi for wi in w)  # (1, 1, n, d)
    if cache is None:
        q, k = rot(q, k)
    else:
        q, k, v = cache.update(q, k, v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n, m = scores.shape[-2:]
    mask = torch.arange(m)[None, :] > torch.arange(m - n, m)[:, None]
    return torch.softmax(scores.masked_fill(mask, -torch.inf), -1) @ v


@pytest.mark.parametrize("name", ["dynamic", "dynamic_yarn", "longrope", "yarn"])
def test_decoding_equals_full_forward(name):
    torch.manual_seed(4)
    rot = rotary(name)
    length = 2 * ORIG + 9
    # float64, so that "equal" means equal: float32 attention alone differs by ~1e-5 between two summation
    # orders
    x = torch.randn(1, 1, length, HEAD_DIM, dtype=torch.float64)
    w = [torch.randn(HEAD_DIM, HEAD_DIM, dtype=torch.float64) / math.sqrt(HEAD_DIM) * 2 for _ in range(3)]
    caches = {mode: RotaryKVCache(rot, mode) for mode in ("unrotated", "rerotate", "hf")}
    worst = dict.fromkeys(caches, 0.0)
    prefill = ORIG // 2
    for cache in caches.values():
        one_layer(x[..., :prefill, :], rot, w, cache)
    for t in range(prefill, length):
        full = one_layer(x[..., : t + 1, :], rot, w)[..., -1, :]  # everything rotated for length t + 1
        for mode, cache in caches.items():
            step = one_layer(x[..., t : t + 1, :], rot, w, cache)[..., -1, :]
            worst[mode] = max(worst[mode], float((step - full).abs().max()))
    assert worst["unrotated"] <= 1e-10 and worst["rerotate"] <= 1e-10, worst
    if name == "yarn":  # a static schedule: every mode is the same
        assert worst["hf"] <= 1e-10
    else:  # transformers' way drifts once the schedule changes with length
        assert worst["hf"] > 1e-3, worst


def test_cache_rejects_bad_input():
    with pytest.raises(ValueError, match="mode"):
        RotaryKVCache(rotary("dynamic"), "sometimes")
    cache = RotaryKVCache(rotary("dynamic"))
    with pytest.raises(ValueError, match="same new tokens"):
        cache.update(
            torch.randn(1, 1, 2, HEAD_DIM), torch.randn(1, 1, 3, HEAD_DIM), torch.randn(1, 1, 3, HEAD_DIM)
        )


def test_fractional_positions_with_a_length_dependent_method():
    # interpolated positions: the context is 1 + floor(largest position)
    torch.manual_seed(5)
    rot = rotary("dynamic")
    x = torch.randn(1, 2, 6, HEAD_DIM, dtype=torch.float64)
    positions = torch.linspace(0.0, 200.5, 6, dtype=torch.float64)
    got = rot.rotate(x, positions)
    want = expected(x, positions.numpy(), "dynamic", "half", 201)
    assert np.abs(got.numpy() - want).max() <= 1e-12


def test_rerotate_mode_keeps_half_precision_keys_from_drifting():
    """Under dynamic NTK the schedule changes at every step past the original context: re-rotating bfloat16
    keys rounded them again each time (2.25 off after 600 steps). Kept in float32, they stay within one
    bfloat16 rounding of the keys rotated afresh, as mode "unrotated" gives them."""
    rot = RotaryEmbedding(64, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16)
    k_all = torch.randn(1, 2, 300, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    q = torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16)
    cache = RotaryKVCache(rot, mode="rerotate")
    for t in range(300):
        _, keys, _ = cache.update(q, k_all[:, :, t : t + 1], k_all[:, :, t : t + 1])
    fresh = rot.rotate(k_all.float(), context_len=300)
    assert keys.dtype == torch.bfloat16
    assert (keys.float() - fresh).abs().max() <= fresh.abs().max() * 2**-8
