"""The exactness table of docs/parallel.md: every term, layout and world size (2, 3, 4 gloo processes),
the largest error of outputs and gradients against posenc.attention on the gathered sequence.

    python -m tests.parallel.exactness_table > benchmarks/results/parallel-exactness.md
"""

import collections
import json
import tempfile

import torch.multiprocessing as mp

from posenc.parallel import LAYOUTS
from tests.parallel.cases import REMAPS, TERMS
from tests.parallel.gloo_worker import run_cases

if __name__ == "__main__":
    table = collections.defaultdict(dict)
    for world in (2, 3, 4):
        cases = []
        for term in TERMS:
            for layout in LAYOUTS:
                for causal in (True, False):
                    if not causal and (
                        term in REMAPS
                        or term in ("sinks", "documents", "fox", "banded", "cope", "cope-documents")
                    ):
                        continue
                    cases.append([term, layout, causal, "float64", 4 * world + 5])
                    cases.append([term, layout, causal, "float64", 4 * world + 6])
                    cases.append([term, layout, causal, "float32", 4 * world + 6])
        d = tempfile.mkdtemp()
        mp.spawn(run_cases, args=(world, d + "/store", d, cases), nprocs=world)
        for r in range(world):
            for term, layout, _causal, dt, _length, err in json.load(open(f"{d}/{r}.json")):
                key = (term, dt)
                col = f"{layout} W={world}"
                table[key][col] = max(table[key].get(col, 0.0), err)
    cols = [f"{layout} W={w}" for w in (2, 3, 4) for layout in LAYOUTS]
    print("| term | dtype | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for (term, dt), row in table.items():
        print(f"| {term} | {dt} | " + " | ".join(f"{row[c]:.0e}" for c in cols) + " |")
