"""posenc train and posenc compare under context parallelism: 2 gloo ranks share every sequence (each a
head-tail half, attention on posenc.parallel's ring) and train the model that one process trains on the
whole batch, up to float summation order; and the refusals, before any work."""

import json
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
from posenc.lab.train import train

SHAPE = dict(n_layer=2, n_head=2, d_model=16, max_len=16)
# positions through a rotary (RoPE, xPos, FoPE), biases at global distances (ALiBi; T5 with parameters),
# the learned input table at global positions, sinks, SSMax's query scale by keys seen. FIRE is exact on the
# ring (tests/parallel), but its MLP biases shift whole score rows, so their true gradient is 0 and AdamW
# turns float32 rounding noise into full-size steps: two summation orders need not train alike.
ENCODINGS = ("rope", "xpos", "fope", "alibi", "t5", "learned", "rope-sinks", "rope-ssmax")
OPT = dict(steps=4, batch_size=2, lr=1e-2, warmup=1, seed=3)
# (run name, encoding, TrainConfig overrides): the answer weight's normalisation spans the global batch, so
# the two ranks' weighted losses average to the one process's
RUNS = [(e, e, {}) for e in ENCODINGS] + [
    ("rope-weighted", "rope", dict(mix="recall=0.5,copy=0.5", answer_weight=4.0))
]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    from posenc.lab.config import GPTConfig, TrainConfig
    from posenc.lab.train import train
    out, corpus, cache = sys.argv[1:4]
    shape, opt = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    for name, encoding, extra in json.loads(sys.argv[6]):
        r = train(GPTConfig(encoding=encoding, **shape), TrainConfig(**opt, **extra), os.path.join(out, name),
                  corpus=corpus, cache_dir=cache, progress=False, context_parallel=2)
        with open(os.path.join(out, f"{name}-rank{dist.get_rank()}.json"), "w") as f:
            json.dump(r.losses, f)
    dist.destroy_process_group()
    """
)


def test_two_context_parallel_ranks_train_what_one_process_trains(corpus_dir, tmp_path):
    script = tmp_path / "cp_train.py"
    script.write_text(SCRIPT)
    out, cache = tmp_path / "cp", tmp_path / "cache"
    load_corpus(corpus_dir, cache_dir=cache)  # the token cache once, before two ranks race for it
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
        json.dumps(SHAPE),
        json.dumps(OPT),
        json.dumps(RUNS),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, encoding, extra in RUNS:
        single = train(
            GPTConfig(encoding=encoding, **SHAPE),
            TrainConfig(**OPT, **extra),
            tmp_path / name,
            corpus=corpus_dir,
            cache_dir=cache,
            progress=False,
        )
        ranks = [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0] == ranks[1]  # the loss of the whole rows, averaged over the two shares
        assert ranks[0][-1][1] == pytest.approx(single.losses[-1][1], rel=1e-5), name
        weights = load_file(latest_checkpoint(out / name) / "model.safetensors")
        for k, v in single.model.state_dict().items():
            torch.testing.assert_close(weights[k], v, rtol=1e-4, atol=1e-5, msg=f"{name}: {k}")


def test_context_parallel_needs_as_many_processes(corpus_dir, tmp_path):
    with pytest.raises(LabError, match=r"--context-parallel 2 must divide the number of processes \(1\)"):
        train(
            GPTConfig(**SHAPE),
            TrainConfig(**OPT),
            tmp_path / "x",
            corpus=corpus_dir,
            progress=False,
            context_parallel=2,
        )


def test_encodings_that_cannot_be_split_are_refused_by_name():
    from posenc.lab.context_parallel import check_context_parallel
    from posenc.lab.encodings import build

    for encoding, why in (("fox", "content bias"), ("shaw", "content bias"), ("rope-random", "drawn per")):
        with pytest.raises(LabError, match=f"does not support the '{encoding}' scheme yet: .*{why}"):
            check_context_parallel(build(GPTConfig(encoding=encoding, **SHAPE)), encoding)


def test_compare_under_two_context_ranks_gives_the_one_process_comparison(corpus_dir, tmp_path):
    # posenc compare --context-parallel 2: every (scheme, seed) trained on 2 spawned gloo ranks, then
    # evaluated as usual; the reported perplexities and the trained weights are the one-process compare's
    from posenc.lab.compare import run_compare
    from posenc.lab.config import settings_for

    # two schemes, one seed each: every trained model costs two process starts (about 3.5 s here)
    settings = settings_for("tiny", schemes=("rope", "alibi"), seeds=1, extensions=())
    cache = tmp_path / "cache"
    runs = {
        size: run_compare(
            tmp_path / f"cp{size}",
            settings,
            corpus=str(corpus_dir),
            cache_dir=str(cache),
            jobs=1,
            progress=False,
            context_parallel=size,
        )
        for size in (1, 2)
    }
    one, two = ({r["scheme"]: r for r in runs[size].rows} for size in (1, 2))
    assert sorted(one) == sorted(two) == ["alibi", "rope"]
    for scheme in one:
        for length, ppl in one[scheme]["ppl"].items():
            assert two[scheme]["ppl"][length] == pytest.approx(ppl, rel=1e-5), (scheme, length)
        run = f"models/{scheme}/seed-{settings.seed}"
        mine, theirs = (
            load_file(latest_checkpoint(tmp_path / f"cp{size}" / run) / "model.safetensors")
            for size in (2, 1)
        )
        for k, v in theirs.items():
            torch.testing.assert_close(mine[k], v, rtol=1e-4, atol=1e-5, msg=f"{run}: {k}")


def test_compare_refuses_context_parallelism_it_cannot_run_before_any_work(tmp_path):
    from posenc.lab.compare import run_compare
    from posenc.lab.config import settings_for

    with pytest.raises(LabError, match="does not support the 'shaw' scheme yet"):
        run_compare(tmp_path / "a", settings_for("tiny", schemes=("rope", "shaw")), context_parallel=2)
    with pytest.raises(LabError, match=r"multiple of 2 x --context-parallel = 6"):
        run_compare(tmp_path / "b", settings_for("tiny", schemes=("rope",)), context_parallel=3)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
