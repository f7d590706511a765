"""posenc under torch.compile and torch.export: no graph breaks, dynamic lengths, gradients, double backward,
meta tensors. Graph capture is checked with dynamo's own tools; inductor runs once on tiny shapes."""

import warnings

import pytest
import torch

import posenc

warnings.filterwarnings("ignore", module="torch._inductor")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() leaves the graph counters running
    yield
    torch._dynamo.reset()


def _inputs(seq, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, seq, 16, generator=gen).requires_grad_(requires_grad)
    k = torch.randn(2, 2, seq, 16, generator=gen).requires_grad_(requires_grad)
    v = torch.randn(2, 2, seq, 16, generator=gen)
    return q, k, v


CALLS = {
    "module": lambda rope, q, k, v: rope(q, k),
    "module at an offset, decoding": lambda rope, q, k, v: rope(q[:, :, -1:], k, offset=3),
    "attention + rope": lambda rope, q, k, v: posenc.attention(q, k, v, rotary=rope),
    "attention + alibi": lambda rope, q, k, v: posenc.attention(q, k, v, bias=posenc.ALiBi(4)),
    "fused path (partial rotary)": lambda rope, q, k, v: PARTIAL(q, k),
}
PARTIAL = posenc.RotaryEmbedding(16, rotary_dim=8)


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_no_graph_breaks(call, layout):
    rope = posenc.RotaryEmbedding(16, layout=layout)
    explained = torch._dynamo.explain(lambda q, k, v: CALLS[call](rope, q, k, v))(*_inputs(12))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_fullgraph_dynamic_lengths_forward_and_backward_equal_eager(layout):
    """One graph serves every length (dynamic=True, no recompiles); values and gradients equal eager's."""
    rope = posenc.RotaryEmbedding(16, layout=layout, scaling={"rope_type": "linear", "factor": 2.0})

    def step(q, k, v):
        return posenc.attention(q, k, v, rotary=rope)

    step(*_inputs(4))  # an eager warm-up step fills the cos/sin memo that the compiled graph then reads
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    for seq in (5, 16, 23):
        q, k, v = _inputs(seq, seed=seq, requires_grad=True)
        got = compiled(q, k, v)
        got.square().sum().backward()
        grads = (q.grad, k.grad)
        q.grad = k.grad = None
        want = step(q, k, v)
        want.square().sum().backward()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        for g, w in zip(grads, (q.grad, k.grad), strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_inductor_compiles_rope_with_dynamic_lengths():
    rope = posenc.RotaryEmbedding(16, layout="half")
    rope(*_inputs(4)[:2])  # eager warm-up: the compiled graph reads the cos/sin memo it fills
    compiled = torch.compile(lambda q, k: rope(q, k), fullgraph=True, dynamic=True)
    for seq in (7, 19):
        q, k, _ = _inputs(seq, seed=seq, requires_grad=True)
        qo, ko = compiled(q, k)
        (qo.sum() + 2 * ko.sum()).backward()
        gq = q.grad
        q.grad = None
        qe, ke = rope(q, k)
        (qe.sum() + 2 * ke.sum()).backward()
        torch.testing.assert_close(qo, qe, rtol=0, atol=1e-6)
        torch.testing.assert_close(ko, ke, rtol=0, atol=1e-6)
        torch.testing.assert_close(gq, q.grad, rtol=0, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_without_a_warm_up_the_graph_computes_cos_sin_itself():
    """No eager call before compiling: fresh float64 angles inside the graph, the same numbers."""
    rope = posenc.RotaryEmbedding(16, layout="interleaved")
    compiled = torch.compile(lambda q, k: rope(q, k, offset=3), fullgraph=True, backend="aot_eager")
    q, k, _ = _inputs(9)
    got = compiled(q, k)
    assert rope.table.cached_rows() == 0  # the traced call did not fill the memo
    for a, b in zip(got, rope(q, k, offset=3), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_torch_export_with_a_dynamic_sequence_length():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = posenc.RotaryEmbedding(16, layout="half")
            self.qkv = torch.nn.Linear(32, 96)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 2, 16).permute(2, 0, 3, 1, 4)
            return posenc.attention(q, k, v, rotary=self.rope)

    model = Attn()
    model(torch.randn(2, 4, 32))  # a memo made before export must not leak into the program
    seq = torch.export.Dim("seq", min=2, max=1024)
    exported = torch.export.export(model, (torch.randn(2, 10, 32),), dynamic_shapes={"x": {1: seq}})
    x = torch.randn(2, 37, 32)
    torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("rotary_dim", [8, 6], ids=["small-tensor path", "fused path"])
def test_double_backward(rotary_dim):
    rope = posenc.RotaryEmbedding(8, rotary_dim=rotary_dim)
    x = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a: rope.rotate(a, offset=2), (x,))
    q, k = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True), torch.randn(1, 2, 3, 8)
    (g,) = torch.autograd.grad(rope(q, k.double())[0].pow(2).sum(), q, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), q)
    assert gg.shape == q.shape


def test_modules_run_shape_only_on_the_meta_device():
    q, k = torch.empty(2, 4, 5, 16, device="meta"), torch.empty(2, 2, 5, 16, device="meta")
    rope = posenc.RotaryEmbedding(
        16, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}
    )
    qo, ko = rope(q, k, positions=torch.arange(5, device="meta"))
    assert qo.device.type == "meta" and qo.shape == q.shape and ko.shape == k.shape
    assert posenc.attention(q, k, k, rotary=rope).shape == (2, 4, 5, 16)
    assert posenc.SinusoidalEncoding(16)(torch.empty(2, 5, 16, device="meta")).device.type == "meta"


def test_sinusoidal_compiles_once_and_never_fills_its_memo_while_traced():
    enc = posenc.SinusoidalEncoding(16)
    compiled = torch.compile(enc, fullgraph=True, dynamic=True, backend="aot_eager")
    for seq in (5, 9, 13):
        x = torch.randn(2, seq, 16)
        torch.testing.assert_close(compiled(x), enc(x) if seq == 13 else posenc.SinusoidalEncoding(16)(x))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(remap=posenc.SelfExtend(2, 4)),
        dict(remap=posenc.ReRoPE(4, leaky=2.0)),
        dict(sinks=torch.linspace(-1, 1, 4)),
    ],
    ids=["selfextend", "leaky-rerope", "sinks"],
)
def test_remaps_and_sinks_compile_whole_while_one_block_holds_them(kwargs):
    """Traced, a band's key range would be a data-dependent shape: the one-block path takes all keys."""
    torch._dynamo.reset()
    rope = posenc.RotaryEmbedding(16)
    q, k, v = (torch.randn(1, 4, 12, 16) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: posenc.attention(q, k, v, rotary=rope, **kwargs), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), posenc.attention(q, k, v, rotary=rope, **kwargs))
