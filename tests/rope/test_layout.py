"""convert_layout (weights between RoPE pairings) and rerotate_keys (moving rotated keys), against rotating
from scratch."""

import numpy as np
import pytest
import torch

import posenc
from posenc import RotaryEmbedding, convert_layout, rerotate_keys
from posenc import reference as R
from posenc.rope.layout import layout_permutation

HEADS, HEAD_DIM, D_MODEL, SEQ = 3, 16, 24, 11


def scores(x, wq, bq, wk, bk, layout, rotary_dim, positions):
    """Attention scores (batch, heads, seq, seq) of one projection + RoPE, through the float64 reference."""

    def heads(w, b):
        y = x @ w.T + b  # (batch, seq, heads * head_dim)
        return y.reshape(x.shape[0], SEQ, HEADS, HEAD_DIM).transpose(1, 2).double().numpy()

    q = R.rope(heads(wq, bq), positions, layout=layout, rotary_dim=rotary_dim)
    k = R.rope(heads(wk, bk), positions, layout=layout, rotary_dim=rotary_dim)
    return q @ np.swapaxes(k, -1, -2)


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, 8])
@pytest.mark.parametrize("direction", [("interleaved", "half"), ("half", "interleaved")])
def test_scores_unchanged_after_converting(rotary_dim, direction):
    src, dst = direction
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, SEQ, D_MODEL, generator=g)
    wq, wk = (torch.randn(HEADS * HEAD_DIM, D_MODEL, generator=g) for _ in range(2))
    bq, bk = (torch.randn(HEADS * HEAD_DIM, generator=g) for _ in range(2))
    positions = np.arange(5, 5 + SEQ)
    want = scores(x, wq, bq, wk, bk, src, rotary_dim, positions)
    conv = [convert_layout(t, HEAD_DIM, from_=src, to=dst, rotary_dim=rotary_dim) for t in (wq, bq, wk, bk)]
    got = scores(x, *conv, dst, rotary_dim, positions)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-6)
    unconverted = scores(x, wq, bq, wk, bk, dst, rotary_dim, positions)
    assert np.abs(unconverted - want).max() > 1e-2  # the layout matters: this test can fail
    back = convert_layout(conv[0], HEAD_DIM, from_=dst, to=src, rotary_dim=rotary_dim)
    assert torch.equal(back, wq)


def test_convert_layout_through_rotary_embedding():
    # the same check with posenc's own module and float32 inputs
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, SEQ, D_MODEL, generator=g)
    wq, wk = (torch.randn(HEADS * HEAD_DIM, D_MODEL, generator=g) for _ in range(2))

    def attn(wq, wk, layout):
        q = (x @ wq.T).reshape(1, SEQ, HEADS, HEAD_DIM).transpose(1, 2)
        k = (x @ wk.T).reshape(1, SEQ, HEADS, HEAD_DIM).transpose(1, 2)
        q, k = RotaryEmbedding(HEAD_DIM, layout=layout)(q, k, offset=1000)
        return q @ k.transpose(-1, -2)

    want = attn(wq, wk, "interleaved")
    got = attn(convert_layout(wq, HEAD_DIM), convert_layout(wk, HEAD_DIM), "half")
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_permutation_is_the_llama_conversion():
    # interleaved -> half puts the even dimensions first, then the odd ones, inside each head
    assert layout_permutation(8, "interleaved", "half").tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert layout_permutation(8, "half", "interleaved").tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert layout_permutation(8, "half", "half", rotary_dim=4).tolist() == list(range(8))


@pytest.mark.parametrize(
    "args, word",
    [
        ((torch.zeros(10, 4), 4), "multiple of head_dim"),
        ((torch.zeros(8, 4), 4, "interleaved", "sideways"), "to"),
        ((torch.zeros(8, 4), 3), "head_dim"),
        ((torch.zeros(2, 8, 4), 4), "weight"),
        (([1.0] * 8, 4), "torch.Tensor"),
        ((torch.zeros(8, 4), 4, "interleaved", "half", 6), "rotary_dim"),
    ],
)
def test_convert_layout_errors(args, word):
    with pytest.raises(ValueError, match=word):
        convert_layout(*args)


# ------------------------------------------------------------------------------ rerotate_keys
SCALINGS = [None, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}]


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_rerotate_equals_rotating_from_scratch(layout, scaling):
    torch.manual_seed(2)
    rot = RotaryEmbedding(HEAD_DIM, rotary_dim=12, layout=layout, scaling=scaling)
    k = torch.randn(2, 3, SEQ, HEAD_DIM)
    positions = torch.arange(40, 40 + SEQ)
    rotated = rot.rotate(k, positions)
    for delta in (7, -40, 2.5):
        got = rerotate_keys(rotated, delta, rot)
        want = rot.rotate(k, positions + delta)
        assert float((got - want).abs().max()) <= 1e-5
    # one shift per key, e.g. after evicting entries 3..5 of the cache (attention sinks keep 0..2)
    keep = torch.cat((torch.arange(3), torch.arange(6, SEQ)))
    delta = torch.where(keep < 3, 0, -3)
    got = rerotate_keys(rotated[..., keep, :], delta, rot)
    want = rot.rotate(k[..., keep, :], positions[keep] + delta)
    assert float((got - want).abs().max()) <= 1e-5
    assert float((rotated[..., keep, :] - want).abs().max()) > 1e-2


def test_rerotate_batched_and_far_against_reference():
    torch.manual_seed(3)
    rot = RotaryEmbedding(HEAD_DIM, layout="half")
    k = torch.randn(2, 3, 4, HEAD_DIM)
    start = torch.tensor([[3_000_000 + i for i in range(4)], [9_000_000 + i for i in range(4)]])
    delta = torch.tensor([[-1_000_000] * 4, [500_001] * 4])
    got = rerotate_keys(rot.rotate(k, start), delta, rot)
    want = R.rope(k.double().numpy(), (start + delta).numpy(), layout="half")
    assert np.abs(got.numpy() - want).max() <= 1e-5


def test_rerotate_with_inv_freq_and_errors():
    torch.manual_seed(4)
    rot = RotaryEmbedding(HEAD_DIM)
    k = torch.randn(1, 1, 5, HEAD_DIM)
    a = rerotate_keys(rot.rotate(k), 3, inv_freq=rot.inv_freq, layout="interleaved")
    assert float((a - rot.rotate(k, offset=3)).abs().max()) <= 1e-5
    with pytest.raises(ValueError, match="delta"):
        rerotate_keys(k, torch.zeros(4), rot)
    with pytest.raises(ValueError, match="delta"):
        rerotate_keys(k, float("nan"), rot)
    with pytest.raises(ValueError, match="inv_freq"):
        rerotate_keys(k, 1)
    with pytest.raises(ValueError, match="layout"):
        rerotate_keys(k, 1, inv_freq=rot.inv_freq, layout="diagonal")


def test_exports():
    assert posenc.convert_layout is convert_layout and posenc.rerotate_keys is rerotate_keys
