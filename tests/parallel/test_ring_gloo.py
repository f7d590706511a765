"""Ring attention on real process groups: 2, 3 and 4 gloo ranks (one CPU process each), every position term,
every layout, causal and not, lengths that no layout divides and packed documents, outputs and gradients
against posenc.attention on the gathered sequence (float64 1e-10, float32 1e-5)."""

import json

import pytest
import torch
import torch.multiprocessing as mp

from posenc.parallel import LAYOUTS

from .cases import TERMS, TOLERANCE
from .gloo_worker import run_cases


def _cases(world: int) -> list:
    cases = []
    for i, term in enumerate(TERMS):
        for j, layout in enumerate(LAYOUTS):
            causal = (i + j) % 2 == 0 or term == "documents"
            length = 4 * world + 3 + i  # never a multiple of 2W: every layout pads
            cases.append([term, layout, causal, "float64", length])
            if j == 0:
                cases.append([term, "headtail", not causal, "float32", length + 1])
    return cases


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_on_gloo_equals_one_process(world, tmp_path):
    cases = _cases(world)
    mp.spawn(run_cases, args=(world, str(tmp_path / "store"), str(tmp_path), cases), nprocs=world, join=True)
    for rank in range(world):
        errors = json.loads((tmp_path / f"{rank}.json").read_text())
        assert len(errors) == len(cases)
        for term, layout, causal, dtype, length, err in errors:
            assert err <= TOLERANCE[getattr(torch, dtype)], (rank, term, layout, causal, dtype, length, err)
