"""The commands' flags are generated from the configs' fields (posenc.runs.flags): one default per setting,
choices from the registries, and the compare task a typed record."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.cli import build_parser, int_list, name_list, positive_int
from posenc.lab.config import PRESETS, GPTConfig, Settings, TrainConfig, settings_for
from posenc.lab.encodings import ENCODINGS, Scheme, registered_names
from posenc.lab.errors import LabError
from posenc.lab.eval_config import EvalConfig
from posenc.lab.passkey import PASSKEY_FILLERS, PASSKEY_STYLES
from posenc.lab.recipes import RECIPES
from posenc.lab.tasks import Task
from posenc.runs.flags import add_flags, flag_values, like, option


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def test_train_without_flags_trains_the_configs_defaults(monkeypatch, tmp_path):
    import posenc.lab.train as lab_train
    from posenc.cli import main

    seen = []

    def fake_train(model_cfg, train_cfg, *args, **kwargs):
        seen.append((model_cfg, train_cfg, kwargs["ckpt_every"], kwargs["device"]))
        raise ValueError("stop here")

    monkeypatch.setattr(lab_train, "train", fake_train)
    assert main(["train", "--encoding", "alibi", "--out", str(tmp_path / "run")]) == 2
    assert seen == [(GPTConfig(encoding="alibi"), TrainConfig(), Settings().ckpt_every, "cpu")]


def test_eval_measures_default_to_the_evaluation_config():
    args = _subparser("eval").parse_args(["run"])
    measured = EvalConfig()
    assert (args.eval_tokens, args.sliding_tokens, args.probe_windows) == (
        measured.eval_tokens,
        measured.sliding_tokens,
        measured.probe_windows,
    )


@pytest.mark.parametrize("preset", list(PRESETS))
def test_compare_without_flags_is_the_preset(preset):
    args = _subparser("compare").parse_args(["--preset", preset])
    assert settings_for(args.preset, **flag_values(Settings, args)) == PRESETS[preset]


@settings(max_examples=20, deadline=None)
@given(
    preset=st.sampled_from(["tiny", "quick"]),
    steps=st.integers(1, 10**6),
    seeds=st.integers(1, 5),
    seed=st.integers(-(2**63), 2**63 - 1),
)
def test_compare_flags_replace_exactly_their_fields(preset, steps, seeds, seed):
    argv = ["--preset", preset, "--steps", str(steps), "--seeds", str(seeds), "--seed", str(seed)]
    args = _subparser("compare").parse_args([*argv, "--protocol", "past,windows"])
    got = settings_for(args.preset, **flag_values(Settings, args))
    assert got == replace(PRESETS[preset], steps=steps, seeds=seeds, seed=seed, protocols=("windows", "past"))


def test_settings_share_the_fields_of_the_model_training_and_evaluation_configs():
    shared = {f.name: f for f in dataclasses.fields(Settings)}
    for cls, names in (
        (GPTConfig, {"n_layer": "n_layer", "n_head": "n_head", "d_model": "d_model", "max_len": "train_len"}),
        (TrainConfig, {n: n for n in ("steps", "batch_size", "lr", "warmup", "seed", "copy_fraction")}),
        (EvalConfig, {n: n for n in ("eval_tokens", "protocols", "sliding_tokens", "probe_windows")}),
    ):
        for f in dataclasses.fields(cls):
            if f.name in names:
                twin = shared[names[f.name]]
                assert (twin.default, twin.metadata) == (f.default, f.metadata), f.name


def test_compare_help_shows_every_presets_value():
    text = " ".join(_subparser("compare").format_help().split())
    by_value: dict[int, list[str]] = {}
    for name, preset in PRESETS.items():
        by_value.setdefault(preset.steps, []).append(name)
    for steps, names in by_value.items():
        assert f"{', '.join(names)} {steps}" in text
    assert f"(default: {PRESETS['quick'].seeds})" in text  # the same in every preset: shown once


def test_choices_come_from_the_registries(monkeypatch):
    assert _action(_subparser("compare"), "--preset").choices == list(PRESETS)
    assert set(_action(_subparser("eval"), "--passkey-style").choices) == set(PASSKEY_STYLES)
    assert set(_action(_subparser("eval"), "--passkey-filler").choices) == set(PASSKEY_FILLERS)
    recipes = " ".join(_action(_subparser("compare"), "--recipes").help.split())
    for name, recipe in RECIPES.items():
        assert f"{name}: {recipe.meaning}" in recipes
    encoding = _action(_subparser("train"), "--encoding").help
    assert all(name in encoding for name in registered_names())
    # a scheme registered after import is offered by the next parser, with its own extensions
    monkeypatch.setitem(ENCODINGS, "zz-late", Scheme("zz-late", lambda cfg: None, ("pi",)))
    assert "zz-late" in _action(_subparser("train"), "--encoding").help
    assert "pi for zz-late" in _action(_subparser("eval"), "--extensions").help


@dataclass(frozen=True)
class _Example:
    name: str = option(help="a required one")
    size: int = option(3, type=positive_int, help="a size")
    lengths: tuple[int, ...] = option((1, 2), type=int_list, help="lengths", flag="lens")
    kinds: tuple[str, ...] = option(
        ("a",), type=name_list, choices=lambda: {"a": "first", "b": "second"}, help="k"
    )
    quiet: bool = option(False, help="a switch")
    plain: int = 7  # no flag


@dataclass(frozen=True)
class _Composed:
    size: int = like(_Example, "size")


def test_a_field_gives_its_default_type_choices_and_name_to_its_flag():
    p = argparse.ArgumentParser()
    add_flags(p, _Example)
    assert {a.dest for a in p._actions} == {"help", "name", "size", "lens", "kinds", "quiet"}
    args = p.parse_args(["--name", "n", "--lens", "4,8", "--kinds", "b,a"])
    assert flag_values(_Example, args) == {
        "name": "n",
        "size": 3,
        "lengths": (4, 8),
        "kinds": ("b", "a"),
        "quiet": False,
    }
    assert "a: first; b: second" in _action(p, "--kinds").help
    with pytest.raises(SystemExit):
        p.parse_args([])  # --name has no default: required
    composed = argparse.ArgumentParser()
    add_flags(composed, _Composed)
    assert composed.parse_args([]).size == 3 and _Composed().size == 3


def test_only_fields_declared_with_a_flag_can_be_offered():
    with pytest.raises(TypeError, match="_Example.plain is not a field declared with option"):
        add_flags(argparse.ArgumentParser(), _Example, ["plain"])
    with pytest.raises(TypeError, match="_Example has no field 'plain' declared with option"):
        like(_Example, "plain")


def test_a_task_is_a_typed_record_and_its_name_only_a_label(tmp_path):
    s = PRESETS["tiny"]
    assert Task("rope", 0).name == "rope"
    assert Task("rope", 1, extension="pi").name == "rope+pi"
    recipe = Task("rope", 1, recipe="pose")
    assert recipe.name == "rope~pose" and recipe.label(replace(s, seeds=2)) == "rope~pose/s1"
    assert recipe.base_run(tmp_path) == tmp_path / "models" / "rope" / "seed-1"
    assert recipe.run_dir(tmp_path, s) == recipe.base_run(tmp_path) / "recipe-pose-x4-0steps"
    assert Task("dir/my.py:fn", 0).base_run(tmp_path).parent.name == "dir_my.py:fn"
    with pytest.raises(LabError, match="not both"):
        Task("rope", 0, extension="pi", recipe="pi")
