"""posenc.lab.train with torch.compile: the same run as eager, and checkpoints that resume either way.

The backend is ``aot_eager`` by default (dynamo tracing plus AOT autograd, seconds on two cores), which
exercises everything compilation changes in the training loop: the traced forward, the compiled backward,
the wrapped module. ``POSENC_TEST_COMPILE_BACKEND=inductor`` runs the same tests with the backend
``posenc train --compile`` uses (about 10 s more per model on two cores).
"""

import os

import pytest
import torch
from torch._dynamo.utils import counters

import posenc.lab.train as lab_train
from posenc.lab.checkpoint import latest_checkpoint, read_checkpoint
from posenc.lab.config import GPTConfig, TrainConfig
from posenc.lab.errors import LabError
from posenc.lab.train import compile_backend, train

BACKEND = os.environ.get("POSENC_TEST_COMPILE_BACKEND", "aot_eager")
OPT = TrainConfig(steps=5, batch_size=4, lr=1e-2, warmup=2, seed=3)

# Inductor fuses and reorders float32 reductions (softmax, RMSNorm, matmul epilogues), which changes each
# result by a few ulps (~1e-7 relative). Five AdamW steps at lr 1e-2 amplify that to well under 1e-5 in
# the loss and the weights; a real difference (a lost rotation, a wrong bias, a skipped update) moves the
# loss by 1e-2 or more. aot_eager runs the same kernels as eager, so it is expected to match exactly.
RTOL, ATOL = 1e-4, 1e-5


def _model(encoding):
    return GPTConfig(encoding=encoding, n_layer=1, n_head=2, d_model=16, max_len=16)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "none", "sinusoidal", "learned", "fox"])
def test_compiled_training_gives_the_losses_of_eager(encoding, corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(lab_train, "_LOG_EVERY", 1)  # a loss for every step, not every tenth
    counters.clear()  # dynamo's counters are per process: count this test's compilation only
    eager = train(_model(encoding), OPT, tmp_path / "eager", corpus=corpus, progress=False)
    compiled = train(
        _model(encoding), OPT, tmp_path / "compiled", corpus=corpus, progress=False, compile=BACKEND
    )
    # It really ran compiled, in one graph: a fallback to eager would match eager trivially.
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert [s for s, _ in compiled.losses] == [1, 2, 3, 4, 5]
    torch.testing.assert_close(
        torch.tensor([v for _, v in compiled.losses]),
        torch.tensor([v for _, v in eager.losses]),
        rtol=RTOL,
        atol=ATOL,
    )
    a, b = eager.model.state_dict(), compiled.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=RTOL, atol=ATOL, msg=k)


def test_compiled_checkpoints_have_plain_keys_and_resume_eager(corpus, tmp_path):
    run = tmp_path / "run"
    train(_model("rope"), OPT, run, corpus=corpus, progress=False, compile=BACKEND, stop_after=3)
    tensors, state, opt_state = read_checkpoint(latest_checkpoint(run))
    assert state["step"] == 3 and opt_state["state"]
    assert not [k for k in tensors if "_orig_mod" in k or k.startswith("module.")]
    assert tensors.keys() == _plain_keys("rope")
    resumed = train(_model("rope"), OPT, run, corpus=corpus, progress=False, resume=True)
    straight = train(_model("rope"), OPT, tmp_path / "straight", corpus=corpus, progress=False)
    assert resumed.step == 5
    for k, v in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, rtol=RTOL, atol=ATOL, msg=k)


def _plain_keys(encoding):
    from posenc.lab.model import GPT

    return set(GPT(_model(encoding)).state_dict())


def test_compile_argument_is_checked():
    assert compile_backend(False) is None and compile_backend(True) == "inductor"
    assert compile_backend("aot_eager") == "aot_eager"
    with pytest.raises(LabError, match=r"compile='fast' is not a torch.compile backend; allowed: True"):
        compile_backend("fast")
