"""posenc.lab.runtime: device names, the torchrun environment, and data-parallel training under torchrun:
two CPU processes (gloo) agree, and match one process."""

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from posenc.lab.checkpoint import latest_checkpoint
from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.data import load_corpus
from posenc.lab.errors import LabError
from posenc.lab.runtime import Processes, check_device
from posenc.lab.train import train

MODEL = dict(encoding="alibi", n_layer=1, n_head=2, d_model=16, max_len=16)


# with the answer bytes weighted: each rank's rows are normalised by the global batch's weights, so that DDP's
# average is the weighted mean of the whole batch (the unweighted loss: tests/lab/test_lab_context_parallel)
OPT = dict(steps=5, batch_size=4, lr=1e-2, warmup=1, seed=3, mix="recall=0.5,copy=0.5", answer_weight=5.0)


SCRIPT = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import torch, torch.distributed as dist
    from posenc.lab.config import GPTConfig, TrainConfig
    from posenc.lab.train import train
    out, corpus, cache = sys.argv[1:4]
    model_kw, opt_kw = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    r = train(GPTConfig(**model_kw), TrainConfig(**opt_kw), out, corpus=corpus, cache_dir=cache,
              progress=False, ckpt_every=2)
    h = hashlib.sha256()
    for k, v in sorted(r.model.state_dict().items()):
        h.update(k.encode()); h.update(v.detach().cpu().numpy().tobytes())
    rank = dist.get_rank()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": dist.get_world_size(), "step": r.step, "sha": h.hexdigest(),
                   "backend": dist.get_backend()}, f)
    dist.destroy_process_group()
    """
)


def test_two_process_ddp_ranks_agree_and_match_single_process(corpus_dir, tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT)
    out, cache = tmp_path / "ddp", tmp_path / "cache"
    load_corpus(corpus_dir, cache_dir=cache)  # build the token cache once, before two ranks race for it
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        str(script),
        str(out),
        str(corpus_dir),
        str(cache),
        json.dumps(MODEL),
        json.dumps(OPT),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["backend"] for r in ranks] == ["gloo", "gloo"]
    assert ranks[0]["step"] == ranks[1]["step"] == OPT["steps"]
    assert ranks[0]["sha"] == ranks[1]["sha"]  # DDP kept the replicas identical

    # Each rank trains on its half of the same global batch, so the run equals one process on the
    # whole batch, up to the order of float additions in the gradient all-reduce.
    single = train(
        GPTConfig(**MODEL),
        TrainConfig(**OPT),
        tmp_path / "single",
        corpus=corpus_dir,
        cache_dir=cache,
        progress=False,
    )
    ddp_weights = load_file(latest_checkpoint(out) / "model.safetensors")
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(ddp_weights[k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name, message",
    [
        ("tpu:0", "device='tpu:0' is not a device; allowed: cpu, cuda, cuda:N"),
        ("meta", "device='meta' is not supported; allowed: cpu, cuda, cuda:N"),
        ("cuda:99", "device='cuda:99'"),
    ],
)
def test_bad_device_names_are_clear_errors(name, message):
    with pytest.raises(LabError, match=re.escape(message)):
        check_device(name)


def test_cpu_is_always_a_device():
    assert check_device("cpu") == torch.device("cpu")


def test_processes_come_from_the_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    p = Processes.from_env()
    assert (p.world, p.rank, p.local_rank, p.distributed) == (4, 2, 0, True)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    assert Processes.from_env() == Processes() and not Processes().distributed
    assert Processes().start("cpu") == torch.device("cpu")
