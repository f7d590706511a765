"""Context parallelism on this machine: one sequence's causal RoPE attention, forward and backward, on 2 gloo
ranks of 1 thread each (:func:`posenc.parallel.ring_attention`, head-tail layout) against one process of 2
threads (:func:`posenc.attention`: torch's CPU flash kernel), and against the same ring walked in one
process of 2 threads (:func:`posenc.parallel.virtual_ring_attention`: the ring's arithmetic without
transfers). Same cores, same work: what the ring's arithmetic and transfers cost where no memory limit
forces it. Peak memory is per process (per rank for the ring), on top of its inputs; each case runs in fresh
processes. Shape: batch 1, 8 query heads, 2 key/value heads of 64 (float32).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch

from .biases import mib
from .report import Column, table

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64
LENGTHS = (4096, 16384)
WORLD = 2


def _inputs(seq: int, indices=None):
    gen = torch.Generator().manual_seed(seq)
    shapes = ((1, HEADS, seq, HEAD_DIM), (1, KV_HEADS, seq, HEAD_DIM), (1, KV_HEADS, seq, HEAD_DIM))
    full = [torch.randn(s, generator=gen) for s in shapes]
    if indices is None:
        return [t.requires_grad_(True) for t in full]
    from posenc.parallel import shard

    return [shard(t, indices, 2).contiguous().requires_grad_(True) for t in full]


def _timed(step, repeat: int) -> tuple[list[float], int]:
    from posenc.runs.memory import peak_meter

    meter = peak_meter(torch.device("cpu"))
    step()  # the first call also pays for one-time set-up (allocator growth, kernel selection)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times, meter()


def _one_process(seq: int, repeat: int, virtual: bool) -> dict:
    import posenc
    from posenc.parallel import shard_indices, virtual_ring_attention

    torch.set_num_threads(WORLD)
    rope = posenc.RotaryEmbedding(HEAD_DIM)
    if virtual:
        indices = [shard_indices(seq, WORLD, r, "headtail") for r in range(WORLD)]
        shards = [_inputs(seq, i) for i in indices]

        def step():
            outs = virtual_ring_attention(
                [s[0] for s in shards],
                [s[1] for s in shards],
                [s[2] for s in shards],
                indices=indices,
                rotary=rope,
            )
            torch.autograd.grad(sum(o.sum() for o in outs), [t for s in shards for t in s])

    else:
        q, k, v = _inputs(seq)

        def step():
            torch.autograd.grad(posenc.attention(q, k, v, rotary=rope).sum(), (q, k, v))

    times, peak = _timed(step, repeat)
    return {"seconds": statistics.median(times), "peak_bytes": peak}


def _rank(rank: int, seq: int, repeat: int, store: str, out: str) -> None:
    import torch.distributed as dist

    import posenc
    from posenc.parallel import ring_attention, shard_indices

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=1800),
    )
    try:
        indices = shard_indices(seq, WORLD, rank, "headtail")
        q, k, v = _inputs(seq, indices)
        rope = posenc.RotaryEmbedding(HEAD_DIM)

        def step():
            dist.barrier()
            out = ring_attention(q, k, v, indices=indices, rotary=rope)
            torch.autograd.grad(out.sum(), (q, k, v))
            dist.barrier()

        times, peak = _timed(step, repeat)
        with open(os.path.join(out, f"{rank}.json"), "w") as f:
            json.dump({"seconds": statistics.median(times), "peak_bytes": peak}, f)
    finally:
        dist.destroy_process_group()


def _ring(seq: int, repeat: int) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(seq, repeat, os.path.join(tmp, "store"), tmp), nprocs=WORLD)
        ranks = [json.load(open(os.path.join(tmp, f"{r}.json"))) for r in range(WORLD)]
    return {"seconds": max(r["seconds"] for r in ranks), "peak_bytes": max(r["peak_bytes"] for r in ranks)}


def run(repeat: int | None = None, lengths=LENGTHS) -> list[dict]:
    """Every length: one process (2 threads), the virtual ring (1 process, 2 threads), 2 gloo ranks."""
    from .attention import in_child

    rows = []
    for seq in lengths:
        reps = repeat or 2
        base = in_child(__name__, "one", seq, reps)
        for case, result in (
            ("one process, 2 threads", base),
            ("virtual ring, 2 threads", in_child(__name__, "virtual", seq, reps)),
            (f"ring, {WORLD} gloo ranks x 1 thread", in_child(__name__, "ring", seq, reps)),
        ):
            row = {"seq": seq, "case": case, **result}
            if "seconds" in row and "seconds" in base:
                row["x_one_process"] = row["seconds"] / base["seconds"]
            rows.append(row)
        print(f"  ring L={seq}: done", file=sys.stderr, flush=True)
    return rows


COLUMNS = (
    Column("L", 6, lambda r: str(r["seq"])),
    Column("case", -30, lambda r: r["case"]),
    Column("fwd+bwd s", 10, lambda r: f"{r['seconds']:.2f}" if "seconds" in r else r.get("skipped", "-")),
    Column("x one process", 14, lambda r: f"{r['x_one_process']:.2f}" if "x_one_process" in r else "-"),
    Column("peak MiB per process", 21, lambda r: mib(r.get("peak_bytes"))),
)


def ring_table(rows: list[dict]) -> str:
    title = (
        f"Causal RoPE attention, {HEADS} query / {KV_HEADS} key-value heads of {HEAD_DIM}, batch 1, float32, "
        "forward + backward, medians; the ring's time is its slower rank's"
    )
    return table(title, COLUMNS, rows, keys=1)


if __name__ == "__main__":
    from .attention import answer_parent

    case, seq, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if case == "ring":
        answer_parent(_ring(seq, reps))
    answer_parent(_one_process(seq, reps, virtual=case == "virtual"))
