"""posenc.lab.train: schedule, determinism, resume (also after SIGKILL), refusing mismatched runs."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from posenc.lab.checkpoint import latest_checkpoint, read_checkpoint
from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.errors import CheckpointError, LabError
from posenc.lab.train import lr_at, train

MODEL = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=16)


OPT = TrainConfig(steps=6, batch_size=4, lr=1e-2, warmup=2, seed=1)


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = TrainConfig(steps=110, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine
    assert lr_at(110, cfg) == pytest.approx(0.1)
    values = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values[:-1], values[1:], strict=True))


def test_training_lowers_the_loss(corpus, tmp_path):
    cfg = TrainConfig(steps=30, batch_size=8, lr=1e-2, warmup=3, seed=0)
    r = train(MODEL, cfg, tmp_path / "run", corpus=corpus, progress=False, ckpt_every=100)
    first, last = r.losses[0][1], r.losses[-1][1]
    assert last < first - 1.0 and last < math.log(256) - 1.5


def test_training_is_deterministic(corpus, tmp_path):
    a = train(MODEL, OPT, tmp_path / "a", corpus=corpus, progress=False)
    b = train(MODEL, OPT, tmp_path / "b", corpus=corpus, progress=False)
    assert_identical(weights(a.model), weights(b.model))
    c = train(
        MODEL, TrainConfig(**{**OPT.__dict__, "seed": 2}), tmp_path / "c", corpus=corpus, progress=False
    )
    assert not torch.equal(a.model.tok.weight, c.model.tok.weight)


@pytest.mark.parametrize("stop", [2, 3])
def test_resume_is_bit_identical_to_an_uninterrupted_run(corpus, tmp_path, stop):
    full = train(MODEL, OPT, tmp_path / "full", corpus=corpus, progress=False, ckpt_every=2)
    part = train(MODEL, OPT, tmp_path / "part", corpus=corpus, progress=False, ckpt_every=2, stop_after=stop)
    assert part.step == stop and latest_checkpoint(tmp_path / "part").name == f"step-{stop:07d}"
    resumed = train(MODEL, OPT, tmp_path / "part", corpus=corpus, progress=False, ckpt_every=2, resume=True)
    assert resumed.step == OPT.steps
    assert_identical(weights(full.model), weights(resumed.model))
    # the optimizer state too: the saved final checkpoints agree tensor for tensor
    _, _, opt_a = read_checkpoint(latest_checkpoint(tmp_path / "full"))
    _, _, opt_b = read_checkpoint(latest_checkpoint(tmp_path / "part"))
    for sa, sb in zip(opt_a["state"].values(), opt_b["state"].values(), strict=True):
        for key in sa:
            assert torch.equal(sa[key], sb[key])


def test_existing_run_without_resume_is_refused(corpus, tmp_path):
    train(MODEL, OPT, tmp_path / "run", corpus=corpus, progress=False, stop_after=2)
    with pytest.raises(LabError, match="already holds a checkpoint.*--resume"):
        train(MODEL, OPT, tmp_path / "run", corpus=corpus, progress=False)


def test_mismatched_config_is_refused_on_resume(corpus, tmp_path):
    train(MODEL, OPT, tmp_path / "run", corpus=corpus, progress=False, stop_after=2)
    other = GPTConfig(encoding="alibi", n_layer=1, n_head=2, d_model=16, max_len=16)
    with pytest.raises(
        CheckpointError,
        match="different configuration.*model.encoding: checkpoint has 'rope', requested 'alibi'",
    ):
        train(other, OPT, tmp_path / "run", corpus=corpus, progress=False, resume=True)
    with pytest.raises(CheckpointError, match="train.lr"):
        train(
            MODEL,
            TrainConfig(**{**OPT.__dict__, "lr": 5e-3}),
            tmp_path / "run",
            corpus=corpus,
            progress=False,
            resume=True,
        )


def _cli(*args):
    return [sys.executable, "-m", "posenc.cli", *args]


def test_kill_at_any_moment_then_resume_matches_uninterrupted(corpus_dir, tmp_path):
    """SIGKILL a training process mid-run; --resume must finish with the uninterrupted run's weights."""
    common = [
        "train",
        "--encoding",
        "alibi",
        "--corpus",
        str(corpus_dir),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--train-len",
        "16",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--d-model",
        "16",
        "--batch-size",
        "4",
        "--steps",
        "40",
        "--warmup",
        "2",
        "--ckpt-every",
        "3",
        "--threads",
        "1",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ref = subprocess.run(
        _cli(*common, "--out", str(tmp_path / "ref")), env=env, capture_output=True, text=True, timeout=120
    )
    assert ref.returncode == 0, ref.stderr
    victim = subprocess.Popen(
        _cli(*common, "--out", str(tmp_path / "run")),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "run" / "checkpoints" / "latest").exists():
        time.sleep(0.02)
    time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = latest_checkpoint(tmp_path / "run")
    assert killed_at is not None
    read_checkpoint(killed_at)  # whatever moment it died, the checkpoint left behind verifies
    res = subprocess.run(
        _cli(*common, "--out", str(tmp_path / "run"), "--resume"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    a = load_file(latest_checkpoint(tmp_path / "ref") / "model.safetensors")
    b = load_file(latest_checkpoint(tmp_path / "run") / "model.safetensors")
    assert_identical(a, b)


def test_bad_train_settings_are_clear_errors():
    with pytest.raises(LabError, match="steps=0"):
        TrainConfig(steps=0)
    with pytest.raises(LabError, match="lr="):
        TrainConfig(lr=-1.0)
    with pytest.raises(LabError, match="ckpt_every"):
        train(MODEL, OPT, "/nonexistent", ckpt_every=0)


def test_copy_fraction_changes_the_batches_and_is_part_of_the_run_state(corpus, tmp_path):
    from dataclasses import replace

    copying = replace(OPT, copy_fraction=1.0)
    a = train(MODEL, OPT, tmp_path / "a", corpus=corpus, progress=False)
    b = train(MODEL, copying, tmp_path / "b", corpus=corpus, progress=False, stop_after=3)
    assert not torch.equal(a.model.tok.weight, b.model.tok.weight)
    with pytest.raises(CheckpointError, match="train.copy_fraction: checkpoint has 1.0, requested None"):
        train(MODEL, OPT, tmp_path / "b", corpus=corpus, progress=False, resume=True)
    # a run without copies records no copy_fraction, so checkpoints from before the field still resume
    state = read_checkpoint(latest_checkpoint(tmp_path / "a"))[1]
    assert "copy_fraction" not in state["train"]
    assert train(MODEL, copying, tmp_path / "b", corpus=corpus, progress=False, resume=True).step == OPT.steps
    assert "passkey_fraction" not in state["train"]


def test_passkey_fraction_is_part_of_the_run_state_and_needs_room_for_the_prompt(corpus, tmp_path):
    from dataclasses import replace

    asking = replace(OPT, passkey_fraction=0.5)
    with pytest.raises(LabError, match="passkey training mix needs windows of at least 36 bytes"):
        train(MODEL, asking, tmp_path / "short", corpus=corpus, progress=False)
    long = replace(MODEL, max_len=40)
    train(long, asking, tmp_path / "a", corpus=corpus, progress=False, stop_after=2)
    with pytest.raises(CheckpointError, match="train.passkey_fraction: checkpoint has 0.5, requested None"):
        train(long, OPT, tmp_path / "a", corpus=corpus, progress=False, resume=True)
