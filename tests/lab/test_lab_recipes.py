"""posenc.lab.recipes: extension by training (PI, YaRN, ABF fine-tuned at the target length, PoSE, the
control), compute-matched, resumable, and in posenc compare as one more row per recipe."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc.cli import main
from posenc.lab.config import PRESETS, GPTConfig, Settings, TrainConfig
from posenc.lab.errors import LabError
from posenc.lab.model import GPT
from posenc.lab.recipes import RECIPES, continued, pose_positions
from posenc.lab.train import train

BASE = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=16)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.integers(0, 100), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_pose_positions_are_two_increasing_runs_inside_the_target(length, extra, batch, seed):
    target = length + extra
    ids = pose_positions(target, batch, length, generator=torch.Generator().manual_seed(seed))
    assert ids.shape == (batch, length) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < target
    steps = ids[:, 1:] - ids[:, :-1]
    assert bool((steps >= 1).all())
    assert bool(((steps > 1).sum(1) <= 1).all())  # one skip at most: two chunks
    jump = torch.where(steps > 1, torch.arange(1, length), length).min(1).values  # the first chunk's size
    assert bool((jump[(steps > 1).any(1)] <= (length + 1) // 2).all())  # at most half the window, rounded up


def test_pose_positions_cover_the_target():
    ids = pose_positions(256, 4000, 64, generator=torch.Generator().manual_seed(0))
    assert int(ids.max()) == 255 and int(ids[:, 0].min()) == 0
    with pytest.raises(LabError, match="target >= length"):
        pose_positions(32, 1, 64)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_recipe_sees_the_same_tokens_per_step(recipe):
    base = TrainConfig(steps=100, batch_size=16, lr=3e-3, warmup=50)
    model, trained = continued(BASE, base, recipe, 4, 40, "runs/x")
    assert trained.batch_size * (trained.seq_len or model.max_len) == 16 * 16
    assert trained.steps == 40 and trained.first_batch == 100 and trained.init_from == "runs/x"
    assert trained.lr == pytest.approx(3e-3 * base.min_lr_ratio) and trained.warmup == 4
    assert model.max_len == 16  # the evaluation's factors stay relative to the training length
    GPT(model)  # every recipe's model builds


def test_the_recipes_models_rotate_as_their_papers_say():
    x = torch.randn(1, 2, 12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = np.arange(12)
    pi = GPT(RECIPES["pi"].adapt(BASE, 4)).rotary
    np.testing.assert_allclose(
        pi.rotate(x).numpy(), reference.rope(x.numpy(), pos / 4, layout=pi.layout), atol=1e-6
    )
    abf = GPT(RECIPES["abf"].adapt(BASE, 4)).rotary
    base = 10000.0 * 4 ** (8 / 6)
    np.testing.assert_allclose(
        abf.rotate(x).numpy(), reference.rope(x.numpy(), pos, base, abf.layout), atol=1e-6
    )
    yarn = GPT(RECIPES["yarn"].adapt(BASE, 4)).rotary
    assert yarn.scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    assert GPT(RECIPES["none"].adapt(BASE, 4)).rotary.scaling is None


def test_pose_trains_at_skipping_positions_and_evaluates_at_ordinary_ones():
    torch.manual_seed(0)
    m = GPT(RECIPES["pose"].adapt(BASE, 4))
    with torch.no_grad():  # sharper attention than the 0.02 init, so that positions show in the logits
        m.blocks[0].qkv.weight.mul_(20.0)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    m.eval()
    plain = m(x)
    m.train()
    assert not torch.allclose(m(x), plain, atol=1e-4)  # positions skipped somewhere in 0 .. 63
    same = GPT(GPTConfig(**{**BASE.__dict__, "pose_len": 16, "rope_scaling": m.cfg.rope_scaling}))
    same.load_state_dict(m.state_dict())
    same.train()
    torch.testing.assert_close(same(x), plain, rtol=0, atol=0)  # no room to skip: ordinary positions


def test_a_continued_run_starts_from_the_base_weights(corpus, tmp_path):
    base_cfg = TrainConfig(steps=2, batch_size=4, warmup=1)
    base = train(BASE, base_cfg, tmp_path / "base", corpus=corpus, progress=False).model
    model_cfg, cont = continued(BASE, base_cfg, "none", 4, 1, str(tmp_path / "base"))
    cont = TrainConfig(**{**cont.__dict__, "lr": 1e-12})  # a step that moves nothing
    again = train(model_cfg, cont, tmp_path / "cont", corpus=corpus, progress=False).model
    for (name, a), b in zip(base.state_dict().items(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=name)


def test_recipes_are_checked_before_any_work():
    with pytest.raises(LabError, match="recipes=.*unknown \\['rerope'\\]"):
        Settings(extend_steps=10, recipes=("pi", "rerope"))
    with pytest.raises(LabError, match="extend_to=3 must divide batch_size=16"):
        Settings(extend_steps=10, extend_to=3)
    with pytest.raises(LabError, match="extend_to=1"):
        Settings(extend_steps=10, extend_to=1)
    with pytest.raises(LabError, match="rope_scaling set for encoding='alibi'"):
        GPTConfig(encoding="alibi", rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(LabError, match=r"names \['pi'\] more than once"):  # two identical rows
        Settings(extend_steps=10, recipes=("pi", "yarn", "pi"))
    with pytest.raises(LabError, match=r"recipes=\[\] is empty with extend_steps=10"):  # none would run
        Settings(extend_steps=10, recipes=())
    with pytest.raises(LabError, match=r"recipes \['pi'\] apply to none of schemes=\['alibi'\]"):
        Settings(extend_steps=10, recipes=("pi",), schemes=("alibi",))
    assert Settings(recipes=()).recipes == ()  # without extend_steps nothing runs, as asked
    s = Settings(extend_steps=10, schemes=("rope", "alibi"))
    assert s.recipes_for("rope") == list(RECIPES) and s.recipes_for("alibi") == []
    assert Settings().recipes_for("rope") == []  # no steps: no recipes


def test_compare_adds_a_row_per_recipe_and_reuses_the_base_rows(corpus_dir, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["compare", "--preset", "tiny", "--out", str(out), "--corpus", str(corpus_dir), "--cache-dir",
            str(cache), "--jobs", "1", "--no-progress", "--schemes", "rope,alibi"]  # fmt: skip
    assert main([*argv, "--extend-steps", "2", "--recipes", "pi,pose,none"]) == 0
    rows = {r["scheme"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    assert {"rope~pi", "rope~pose", "rope~none"} <= set(rows) and not any("alibi~" in r for r in rows)
    assert all(math.isfinite(v) for r in rows.values() for v in r["ppl"].values() if v is not None)
    assert (out / "models" / "rope" / "seed-0" / "recipe-pi-x4-2steps").is_dir()
    base_rows = {p: p.stat().st_mtime_ns for p in out.glob("models/*/seed-0/eval*.json")}
    assert main([*argv, "--extend-steps", "3", "--recipes", "none"]) == 0  # other recipe settings
    assert {p: p.stat().st_mtime_ns for p in out.glob("models/*/seed-0/eval*.json")} == base_rows  # reused
    rows = {r["scheme"] for r in json.loads((out / "results.json").read_text())["results"]}
    assert "rope~none" in rows and "rope~pi" not in rows
    assert PRESETS["tiny"].extend_steps == 0
