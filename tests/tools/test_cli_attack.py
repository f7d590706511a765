"""Every command attacked the way a new user might: every numeric option given a value no command accepts
(NaN for a number, -7 for a count or length, integers past int64), every comma-separated list given a
duplicate or nothing, every file argument a path that is missing, of the wrong kind, unreadable or without
the expected content: exit status 2 and one ``error:`` line naming the argument, never a traceback, and
never any work started (the functions that do the work raise :class:`WorkStarted` here)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from posenc.cli import build_parser, main

# what a command needs besides the attacked option to get as far as checking it
REQUIRED = {
    "train": ["--encoding", "rope", "--out", "{tmp}/train"],
    "eval": ["{tmp}/missing-run"],
    "sample": ["{tmp}/missing-run"],
    "compare": ["--out", "{tmp}/compare"],
    "extend": ["--out", "{tmp}/extend", "--no-plot"],
    "plot frequencies": ["--out", "{tmp}/f.png"],
    "plot plan": ["{tmp}/config.json", "--out", "{tmp}/plan.png"],
    "bench": ["--out", "{tmp}/bench.json"],
    "tour": ["--out", "{tmp}/tour"],
    "zoo": ["--json", "{tmp}/zoo.json"],
}
VALID_NEGATIVE = {"--seed"}  # any integer seeds a generator
PAST_INT64 = ("99999999999999999999", str(2**63), str(-(2**63) - 1))

# the functions that start the work of each command: none may be reached by a refused argument
WORK = (
    ("posenc.lab.train", "train"),
    ("posenc.lab.compare", "run_compare"),
    ("posenc.lab.data", "load_corpus"),
    ("posenc.lab.evaluate", "evaluate"),
    ("posenc.lab.model", "GPT.generate"),
    ("posenc.real.extend", "run_extend"),
    ("posenc.real.loader", "load_real_model"),
    ("posenc.tools.zoo", "sweep"),
    ("posenc.tools.tour", "run_claims"),
    ("posenc.tools.benchmarks.presets", "preset"),
    ("posenc.tools.plot", "plot_frequencies"),
    ("posenc.tools.plot", "plan_figure"),
)


class WorkStarted(Exception):
    """Raised by every function of :data:`WORK`: a refused argument got as far as the work."""


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    import importlib

    def refuse(*args, **kwargs):
        raise WorkStarted("the command started its work before refusing the argument")

    for module, attr in WORK:
        target = importlib.import_module(module)
        *owner, name = attr.split(".")
        for part in owner:
            target = getattr(target, part)
        monkeypatch.setattr(target, name, refuse)


def _kind(action) -> str:
    """What an option's type parses: "int", "float", "ints", "names", or "" (a string, a flag)."""
    if not action.option_strings or action.type in (None, str) or action.choices:
        return ""
    try:
        value = action.type("7")
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return ""
    if isinstance(value, list):
        return "ints" if all(isinstance(v, int) for v in value) else "names"
    return {int: "int", float: "float"}.get(type(value), "")


def _options():
    """(command, flag, kind, dest) of every option of every command."""
    found = []

    def walk(prefix, p):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{prefix} {name}".strip(), sub)
            elif _kind(action):
                found.append((prefix, action.option_strings[-1], _kind(action), action.dest))

    walk("", build_parser())
    return found


def numeric_options():
    return [
        (c, f, "nan" if k == "float" else "-7", d)
        for c, f, k, d in _options()
        if k in ("int", "float", "ints") and f not in VALID_NEGATIVE
    ]


OPTIONS = numeric_options()


def _refused(argv, names, capsys) -> None:
    """``posenc argv`` exits 2 with one ``error:`` line naming one of ``names``, no traceback, no work."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    except WorkStarted:
        pytest.fail(f"posenc {' '.join(argv)} started its work before refusing")
    err = capsys.readouterr().err.strip()
    assert code == 2, f"posenc {' '.join(argv)} exited {code}: {err!r}"
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, f"posenc {' '.join(argv)}: {err!r}"
    assert any(n in errors[0] for n in names), f"posenc {' '.join(argv)}: {errors[0]!r} names none of {names}"


def _argv(command: str, tmp, *attack) -> list[str]:
    return [*command.split(), *(a.format(tmp=tmp) for a in REQUIRED.get(command, [])), *attack]


@pytest.mark.parametrize("command, flag, value, dest", OPTIONS, ids=[f"{c}{f}" for c, f, _, _ in OPTIONS])
def test_a_value_no_command_accepts_is_refused_naming_the_option(
    command, flag, value, dest, tmp_path, capsys
):
    named = (flag, dest, dest.replace("_", "-"), flag.lstrip("-").replace("-", "_"))
    _refused(_argv(command, tmp_path, flag, value), named, capsys)


INTEGERS = [(c, f, v, d) for c, f, k, d in _options() if k in ("int", "ints") for v in PAST_INT64]


@pytest.mark.parametrize(
    "command, flag, value, dest", INTEGERS, ids=[f"{c}{f}={v}" for c, f, v, _ in INTEGERS]
)
def test_an_integer_past_int64_is_refused_naming_the_option(command, flag, value, dest, tmp_path, capsys):
    """Past what torch and numpy hold, every integer option of every command (seeds included) is refused
    at parsing, never an OverflowError deep inside a tensor call."""
    _refused(_argv(command, tmp_path, flag, value), (flag,), capsys)


LISTS = [
    (c, f, v)
    for c, f, k, _ in _options()
    if k in ("ints", "names")
    for v in ("7,7" if k == "ints" else "x,x", ",")
]


@pytest.mark.parametrize("command, flag, value", LISTS, ids=[f"{c}{f}={v}" for c, f, v in LISTS])
def test_a_list_with_a_duplicate_or_nothing_is_refused(command, flag, value, tmp_path, capsys):
    """A comma-separated list naming an item twice would run it twice (two identical rows); an empty one
    would run nothing, or silently fall back to the default."""
    _refused(_argv(command, tmp_path, flag, value), (flag,), capsys)


def _files(tmp) -> dict:
    """The paths the file attacks use, made under ``tmp``."""
    (tmp / "adir").mkdir()
    (tmp / "afile").write_text("just some text\n")
    (tmp / "binary.dat").write_bytes(bytes(range(256)) * 64)
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "rope_theta": 10000.0,
                "max_position_embeddings": 128,
            }  # fmt: skip
        )
    )
    (tmp / "badrun").mkdir()
    (tmp / "badrun" / "manifest.json").write_text("not json")
    (tmp / "tour" / "tour.png").mkdir(parents=True)  # where tour --out DIR writes its figure
    return {}


# (command, the arguments after REQUIRED's, what the one error line names)
FILE_ATTACKS = [
    *[
        (c, ["--out", bad], "--out")
        for c in ("train", "compare", "extend")
        for bad in ("{tmp}/afile", "{tmp}/afile/sub")
    ],
    *[(c, ["--cache-dir", "{tmp}/afile"], "--cache-dir") for c in ("train", "eval", "compare", "extend")],
    *[
        (c, ["--corpus", bad], "corpus")
        for c in ("train", "eval", "compare", "extend")
        for bad in ("{tmp}/missing", "{tmp}/binary.dat")
    ],
    *[(c, [], "CKPT") for c in ("eval", "sample")],  # REQUIRED's missing run
    *[
        (c, [bad], "CKPT")
        for c in ("eval", "sample")
        for bad in ("{tmp}/afile", "{tmp}/adir", "{tmp}/badrun")
    ],
    *[("eval", ["{tmp}/adir", "--json", bad], "--json") for bad in ("{tmp}/adir", "{tmp}/afile/x.json")],
    *[
        (c, ["--out", bad], "--out")
        for c in ("plot frequencies", "plot plan", "bench")
        for bad in ("{tmp}/adir", "{tmp}/afile/x.png")
    ],
    *[(c, ["--out", "{tmp}/f.v2"], "--out") for c in ("plot frequencies", "plot plan")],
    *[
        ("plot plan", [bad], "CONFIG")
        for bad in ("{tmp}/missing.json", "{tmp}/adir", "{tmp}/binary.dat", "{tmp}/afile", "{tmp}/list.json")
    ],
    ("tour", ["--out", "{tmp}/afile"], "--out"),
    ("tour", [], "--out"),  # REQUIRED's DIR holds a folder named tour.png
    *[("extend", ["--model", bad], "--model") for bad in ("{tmp}/missing", "{tmp}/adir", "{tmp}/afile")],
    *[("zoo", ["--json", bad], "--json") for bad in ("{tmp}/adir", "{tmp}/afile/x.json")],
    *[
        ("zoo", ["--docs", bad], "--docs")
        for bad in ("{tmp}/missing.md", "{tmp}/adir", "{tmp}/afile", "{tmp}/binary.dat")
    ],
    *[("zoo", ["--types", bad], "--types") for bad in (",", "llama,llama")],
]


@pytest.mark.parametrize(
    "command, attack, named", FILE_ATTACKS, ids=[f"{c} {' '.join(a)}" for c, a, _ in FILE_ATTACKS]
)
def test_a_path_that_cannot_be_used_is_refused_before_any_work(command, attack, named, tmp_path, capsys):
    """Missing, a folder where a file is expected or a file where a folder is, or a file without the
    content the command reads: one line naming the argument, before any work."""
    _files(tmp_path)
    argv = [*_argv(command, tmp_path), *(a.format(tmp=tmp_path) for a in attack)]
    if command in ("eval", "sample") and attack and not attack[0].startswith("-"):
        argv = [*command.split(), *(a.format(tmp=tmp_path) for a in attack)]  # the attacked CKPT
    if command == "plot plan" and attack and not attack[0].startswith("-"):
        argv = ["plot", "plan", attack[0].format(tmp=tmp_path), "--out", str(tmp_path / "plan.png")]
    _refused(argv, (named,), capsys)


UNREADABLE = [
    ("train", ["--corpus", "{file}"], "corpus"),
    ("extend", ["--corpus", "{file}"], "corpus"),
    ("zoo", ["--docs", "{file}"], "--docs"),
]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
@pytest.mark.parametrize("command, attack, named", UNREADABLE, ids=[c for c, _, _ in UNREADABLE])
def test_an_unreadable_file_is_refused_naming_the_argument(command, attack, named, tmp_path, capsys):
    file = tmp_path / "secret.txt"
    file.write_text("<!-- zoo:begin -->\n<!-- zoo:end -->\n")
    file.chmod(0)
    argv = [*_argv(command, tmp_path), *(a.format(file=file) for a in attack)]
    _refused(argv, (named,), capsys)
    argv = ["plot", "plan", str(file), "--out", str(tmp_path / "p.png")]
    _refused(argv, ("CONFIG",), capsys)


@pytest.mark.parametrize("command, attack, named", UNREADABLE, ids=[c for c, _, _ in UNREADABLE])
def test_a_file_that_refuses_reading_is_refused_naming_the_argument(
    command, attack, named, tmp_path, capsys, monkeypatch
):
    """As above, for any user (root reads any file): the file's permission check and every read of it
    fail as an unreadable file's would."""
    import builtins
    import pathlib

    file = tmp_path / "secret.txt"
    file.write_text("<!-- zoo:begin -->\n<!-- zoo:end -->\n")
    real_access, real_open = os.access, builtins.open

    def secret(path) -> bool:
        return isinstance(path, (str, os.PathLike)) and os.path.abspath(os.fspath(path)) == str(file)

    def access(path, mode, *args, **kwargs):
        return not (secret(path) and mode & os.R_OK) and real_access(path, mode, *args, **kwargs)

    def opened(path, *args, **kwargs):
        if secret(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(pathlib.Path, "open", lambda self, *a, **k: opened(self, *a, **k))
    argv = [*_argv(command, tmp_path), *(a.format(file=file) for a in attack)]
    _refused(argv, (named,), capsys)
    argv = ["plot", "plan", str(file), "--out", str(tmp_path / "p.png")]
    _refused(argv, ("CONFIG",), capsys)
