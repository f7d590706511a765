"""posenc.lab.checkpoint: atomic checkpoints, corrupt ones refused, loading a trained model."""

import json

import pytest
import torch
from safetensors.torch import load_file

from posenc.lab.checkpoint import (
    is_complete,
    latest_checkpoint,
    load_model,
    read_checkpoint,
    run_state,
    save_checkpoint,
)
from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.errors import CheckpointError
from posenc.lab.model import GPT
from posenc.lab.train import train

MODEL = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=16)
OPT = TrainConfig(steps=6, batch_size=4, lr=1e-2, warmup=2, seed=1)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupt_checkpoint_is_reported_not_loaded(corpus, tmp_path, damage):
    train(MODEL, OPT, tmp_path / "run", corpus=corpus, progress=False, stop_after=2)
    ckpt = latest_checkpoint(tmp_path / "run")
    target = ckpt / "model.safetensors"
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[-5] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(bytes(data[: len(data) // 2]))
    else:
        target.unlink()
    with pytest.raises(CheckpointError, match=str(ckpt)):
        train(MODEL, OPT, tmp_path / "run", corpus=corpus, progress=False, resume=True)
    with pytest.raises(CheckpointError, match="corrupt|incomplete") as info:
        load_model(tmp_path / "run")
    assert "to go back to the run's previous checkpoint, or the run directory to train it again" in str(
        info.value
    )


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_model(tmp_path)


def test_checkpoint_holds_safetensors_weights_and_json_config(corpus, tmp_path):
    r = train(MODEL, OPT, tmp_path / "run", corpus=corpus, progress=False)
    ckpt = latest_checkpoint(tmp_path / "run")
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "manifest.json",
        "model.safetensors",
        "optimizer.pt",
        "state.json",
    ]
    tensors = load_file(ckpt / "model.safetensors")
    for k, v in r.model.state_dict().items():
        assert torch.equal(tensors[k], v)
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == OPT.steps and state["model"] == MODEL.to_dict()
    model, _ = load_model(tmp_path / "run")
    x = torch.randint(0, 256, (1, 8))
    assert torch.equal(model(x), r.model(x))
    # only one complete checkpoint is kept, and no temporary directories are left behind
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "latest",
        f"step-{OPT.steps:07d}",
    ]


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    model = GPT(MODEL)
    save_checkpoint(tmp_path, 1, model, None, {"model": MODEL.to_dict()})

    def boom(*a, **k):
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, model, None, {"model": MODEL.to_dict()})
    assert latest_checkpoint(tmp_path).name == "step-0000001"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-0000001"]
    read_checkpoint(latest_checkpoint(tmp_path))  # still verifies


def test_is_complete_reads_the_step_of_the_latest_checkpoint(tmp_path):
    assert not is_complete(tmp_path, 1)
    save_checkpoint(tmp_path, 3, GPT(MODEL), None, run_state(MODEL, OPT, "corpus"))
    assert is_complete(tmp_path, 3) and not is_complete(tmp_path, 4)


def test_load_model_takes_a_checkpoint_directory_and_refuses_one_that_misfits_its_config(tmp_path):
    model = GPT(MODEL)
    ckpt = save_checkpoint(tmp_path / "a", 1, model, None, {"model": MODEL.to_dict()})
    loaded, state = load_model(ckpt)
    assert state["step"] == 1 and not loaded.training
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    other = save_checkpoint(tmp_path / "b", 1, model, None, {"model": {**MODEL.to_dict(), "n_layer": 2}})
    with pytest.raises(CheckpointError, match="does not fit its own config"):
        load_model(other)
    bare = save_checkpoint(tmp_path / "c", 1, model, None, {})
    with pytest.raises(CheckpointError, match="has no model config"):
        load_model(bare)


def test_without_the_latest_pointer_the_newest_step_directory_is_the_checkpoint(tmp_path):
    """A run whose ``latest`` pointer was lost, its step directories intact, used to be taken for a new run
    (``--resume`` retrained from step 0 over it)."""
    model = GPT(MODEL)
    for step in (2, 10):
        save_checkpoint(tmp_path, step, model, None, {"model": MODEL.to_dict()})
    (tmp_path / "checkpoints" / "latest").unlink()
    (tmp_path / "checkpoints" / "step-0000011.tmp").mkdir()  # a write killed before its rename: ignored
    assert latest_checkpoint(tmp_path).name == "step-0000010"
    read_checkpoint(latest_checkpoint(tmp_path))
    assert latest_checkpoint(tmp_path / "nothing") is None
