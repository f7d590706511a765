"""A gloo rank of the ring-attention exactness tests: every case's shard through ring_attention, forward and
backward, against posenc.attention on the whole sequence computed in this process; the largest error per
case written to ``out/<rank>.json``."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from posenc.parallel import ring_attention, shard

from .cases import gradients, make_case, parameter_error, weight_for
from .group import gloo_rank


def run_cases(rank: int, world: int, store: str, out: str, cases: list) -> None:
    with gloo_rank(rank, world, store):
        errors = []
        for term, layout, causal, dtype_name, length in cases:
            dtype = getattr(torch, dtype_name)
            case = make_case(term, length, causal, dtype, v_dim=8 if length % 2 else 6)
            indices = case.indices(world, rank, layout)
            out_shard = ring_attention(
                shard(case.q, indices, 2),
                shard(case.k, indices, 2),
                shard(case.v, indices, 2),
                indices=indices,
                **case.shard_kwargs(indices),
            )
            weight = weight_for(case)
            mine = gradients(case, out_shard, shard(weight, indices, 2))
            for g in mine[3:]:  # the bias's and sinks' parameters: each rank holds its queries' share
                dist.all_reduce(g)
            ref = case.reference()
            theirs = gradients(case, ref, weight)
            keep = indices >= 0
            real = indices[keep]
            err = (out_shard[:, :, keep] - ref[:, :, real]).abs().max().item()
            for a, b in zip(mine[:3], theirs[:3], strict=True):  # q, k, v: this rank's tokens
                err = max(err, (a.index_select(2, real) - b.index_select(2, real)).abs().max().item())
            for a, b in zip(mine[3:], theirs[3:], strict=True):
                err = max(err, parameter_error(a, b))
            errors.append([term, layout, causal, dtype_name, length, err])
        with open(os.path.join(out, f"{rank}.json"), "w") as f:
            json.dump(errors, f)
