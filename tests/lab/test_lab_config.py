"""posenc.lab.config: the shared validators, the model/training/comparison settings and the presets."""

import json
import math
import re

import pytest

from posenc.lab.checks import check_choice, check_choices, check_int, check_lengths, check_number
from posenc.lab.config import PRESETS, GPTConfig, Settings, TrainConfig, settings_for
from posenc.lab.errors import LabError


def test_settings_validation():
    with pytest.raises(LabError, match="preset='huge' is not known; allowed: tiny, quick, standard, gpu"):
        settings_for("huge")
    with pytest.raises(LabError, match=r"unknown \['ropee'\]"):
        Settings(schemes=("rope", "ropee"))
    with pytest.raises(LabError, match=r"unknown \['rerope'\]; allowed: pi, ntk, dynamic, yarn"):
        Settings(extensions=("pi", "rerope"))
    assert settings_for("quick", steps=None).steps == PRESETS["quick"].steps
    assert settings_for("quick", steps=7).steps == 7


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            {"encoding": "ropee"},
            "encoding='ropee' is not known; allowed: alibi, banded, cope, fire, fope, fox, "
            "gemma-local-global, kerple, learned, local, none, nope, p-rope, rope, rope-above-bound, "
            "rope-below-bound, rope-random, rope-sinks, rope-ssmax, sandwich, shaw, sinusoidal, "
            "sinusoidal-random, smollm3, swan, t5, xpos, or your own as 'package.module:function'",
        ),
        ({"encoding": "rope", "d_model": 30, "n_head": 4}, "d_model=30 must be a multiple of n_head=4"),
        ({"encoding": "rope", "n_layer": 0}, "n_layer=0"),
    ],
)
def test_bad_config_is_a_clear_error(kw, match):
    with pytest.raises(LabError, match=match):
        GPTConfig(**kw)


def test_config_round_trips_and_rejects_unknown_keys():
    cfg = GPTConfig(encoding="alibi", d_model=32, n_head=2)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(LabError, match="unknown keys"):
        GPTConfig.from_dict({**cfg.to_dict(), "dropout": 0.1})


@pytest.mark.parametrize("bad", [[], [0, 8], [8, 8], ["x"]])
def test_bad_lengths_are_clear_errors(bad):
    with pytest.raises(LabError, match="eval_lens"):
        check_lengths("eval_lens", bad)


@pytest.mark.parametrize("value", [0, -3, 1.5, "4", True, None])
def test_check_int_names_the_field_the_value_and_what_is_allowed(value):
    with pytest.raises(LabError, match=rf"^steps={re.escape(repr(value))} must be a positive integer$"):
        check_int("steps", value)


def test_check_int_minimum_and_pass_through():
    assert check_int("steps", 3) == 3
    assert check_int("warmup", 0, minimum=0) == 0
    with pytest.raises(LabError, match=r"^warmup=-1 must be an integer >= 0$"):
        check_int("warmup", -1, minimum=0)


@pytest.mark.parametrize(
    "kw, value, message",
    [
        (dict(low=0, low_open=True, finite=True), 0.0, "x=0.0 must be a finite number > 0"),
        (dict(low=0, low_open=True, finite=True), math.inf, "x=inf must be a finite number > 0"),
        (dict(low=0, high=1), 1.5, "x=1.5 must be a number in [0, 1]"),
        (dict(low=0, high=1, low_open=True), 0, "x=0 must be a number in (0, 1]"),
        (dict(low=0), -1, "x=-1 must be a number >= 0"),
        (dict(low=0), math.nan, "x=nan must be a number >= 0"),
        (dict(low=0), "1", "x='1' must be a number >= 0"),
        (dict(low=0), True, "x=True must be a number >= 0"),
        (dict(low=0, why="0 means greedy"), -1, "x=-1 must be a number >= 0 (0 means greedy)"),
    ],
)
def test_check_number_names_the_field_the_value_and_the_range(kw, value, message):
    with pytest.raises(LabError) as e:
        check_number("x", value, **kw)
    assert str(e.value) == message


def test_check_number_accepts_the_range_ends():
    assert check_number("r", 0, low=0, high=1) == 0 and check_number("r", 1, low=0, high=1) == 1
    assert check_number("clip", math.inf, low=0) == math.inf  # infinities are refused only when finite=True


def test_check_choice_and_choices_list_what_is_allowed():
    assert check_choice("preset", "tiny", PRESETS) == "tiny"
    with pytest.raises(LabError, match="^x='c' is not known; allowed: a, b$"):
        check_choice("x", "c", ["a", "b"])
    assert check_choices("xs", ["a"], ["a", "b"]) == ("a",)
    assert check_choices("xs", (), ["a"], empty_ok=True) == ()
    with pytest.raises(LabError, match=r"^xs=\[\] is empty; give one or more of: a$"):
        check_choices("xs", (), ["a"])


def test_every_settings_class_uses_the_shared_messages():
    with pytest.raises(LabError, match=r"^batch_size=0 must be a positive integer$"):
        TrainConfig(batch_size=0)
    with pytest.raises(LabError, match=r"^warmup=-1 must be an integer >= 0$"):
        TrainConfig(warmup=-1)
    with pytest.raises(LabError, match=r"^min_lr_ratio=2 must be a number in \[0, 1\]$"):
        TrainConfig(min_lr_ratio=2)
    with pytest.raises(LabError, match=r"^grad_clip=-1 must be a number >= 0 \(0 turns clipping off\)$"):
        TrainConfig(grad_clip=-1)
    with pytest.raises(LabError, match=r"^weight_decay=-0.1 must be a number >= 0$"):
        TrainConfig(weight_decay=-0.1)
    with pytest.raises(LabError, match=r"^train_len=0 must be a positive integer$"):
        Settings(train_len=0)
    with pytest.raises(LabError, match=r"^d_model=True must be a positive integer$"):
        GPTConfig(d_model=True)


def test_settings_json_and_the_configs_they_build():
    s = PRESETS["tiny"]
    j = s.to_json()
    assert j["eval_mults"] == [1, 2, 4] and j["schemes"] == list(s.schemes) and json.loads(json.dumps(j)) == j
    assert s.eval_lens == [16, 32, 64]
    assert s.model_config("alibi") == GPTConfig(encoding="alibi", n_layer=1, n_head=2, d_model=16, max_len=16)
    assert s.train_config() == TrainConfig(steps=4, batch_size=4, lr=3e-3, warmup=1, seed=0)
    assert Settings(extensions=()).extensions == ()


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"seeds": 0}, "seeds=0 must be a positive integer"),
        ({"protocols": ("windows", "chunked")}, "unknown ['chunked']; allowed: windows, sliding, past"),
        ({"protocols": ()}, "protocols=[] is empty; give one or more of: windows, sliding, past"),
        ({"sliding_tokens": 0}, "sliding_tokens=0 must be a positive integer"),
        ({"probe_windows": -1}, "probe_windows=-1 must be an integer >= 0"),
        ({"copy_fraction": 1.5}, "copy_fraction=1.5 must be a number in [0, 1]"),
        ({"copy_fraction": math.nan}, "copy_fraction=nan must be a number in [0, 1]"),
        ({"passkey_fraction": -0.5}, "passkey_fraction=-0.5 must be a number in [0, 1]"),
        (
            {"copy_fraction": 0.5, "passkey_fraction": 0.75},
            "copy_fraction=0.5 and passkey_fraction=0.75 add up to 1.25; the shares of the training mix",
        ),
        ({"passkey_fraction": 0.5, "train_len": 16}, "passkey_fraction=0.5 needs train_len >= 35"),
        ({"passkey_trials": -1}, "passkey_trials=-1 must be an integer >= 0"),
    ],
)
def test_seed_protocol_and_probe_settings_are_checked(kw, message):
    with pytest.raises(LabError, match=re.escape(message)):
        Settings(**kw)


def test_protocols_keep_their_canonical_order_and_seeds_reach_the_training_config():
    assert Settings(protocols=("past", "windows", "past")).protocols == ("windows", "past")
    s = Settings(seed=3, seeds=4, copy_fraction=0.25, passkey_fraction=0.5)
    assert s.train_config().seed == 3 and s.train_config(5).seed == 5
    assert s.train_config().copy_fraction == 0.25 and s.train_config().passkey_fraction == 0.5
    with pytest.raises(LabError, match="copy_fraction=0.5 and passkey_fraction=0.75 add up to 1.25"):
        TrainConfig(copy_fraction=0.5, passkey_fraction=0.75)
    standard = PRESETS["standard"]
    assert standard.steps > PRESETS["quick"].steps  # longer training, everything else as quick
    same = {k: v for k, v in standard.to_json().items() if k not in ("steps", "ckpt_every")}
    assert same == {k: v for k, v in PRESETS["quick"].to_json().items() if k not in ("steps", "ckpt_every")}


def test_what_would_fail_after_training_is_refused_before_any(tmp_path):
    """--train-len 1 trained every model before extension 'temp' refused it; a user scheme returning
    something other than an Encoding failed with an AttributeError inside the model."""
    with pytest.raises(LabError, match="extension 'temp' .* needs train_len >= 2, got 1"):
        settings_for("tiny", train_len=1)
    (tmp_path / "bad_scheme.py").write_text("def scheme(cfg):\n    return 'rope'\n")
    spec = f"{tmp_path / 'bad_scheme.py'}:scheme"
    with pytest.raises(LabError, match=r"encoding=.*bad_scheme.py:scheme' built a str, not a posenc.lab"):
        settings_for("tiny", schemes=(spec,))
    from posenc.lab.config import GPTConfig
    from posenc.lab.model import GPT

    with pytest.raises(LabError, match="built a str"):
        GPT(GPTConfig(encoding=spec))
