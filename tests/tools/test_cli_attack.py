"""Every numeric option of every command given a value no command accepts (NaN for a number, -7 for a
count or length): exit status 2 and one line naming the option, never a traceback nor work started."""

from __future__ import annotations

import argparse

import pytest

from posenc.cli import build_parser, main

# what a command needs besides the attacked option to get as far as checking it
REQUIRED = {
    "train": ["--encoding", "rope", "--out", "{tmp}/train"],
    "eval": ["{tmp}/missing-run"],
    "sample": ["{tmp}/missing-run"],
    "compare": ["--out", "{tmp}/compare"],
    "extend": ["--out", "{tmp}/extend"],
    "plot frequencies": ["--out", "{tmp}/f.png"],
    "bench": ["--out", "{tmp}/bench.json"],
}
VALID_NEGATIVE = {"--seed"}  # any integer seeds a generator


def numeric_options():
    parser = build_parser()
    found = []

    def walk(prefix, p):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{prefix} {name}".strip(), sub)
            elif action.option_strings and action.type not in (None, str):
                flag = action.option_strings[-1]
                kind = getattr(action.type, "__name__", "")
                if flag in VALID_NEGATIVE or kind in ("_str_list",):
                    continue
                found.append((prefix, flag, "nan" if kind == "float" else "-7", action.dest))

    walk("", parser)
    return found


OPTIONS = numeric_options()


@pytest.mark.parametrize("command, flag, value, dest", OPTIONS, ids=[f"{c}{f}" for c, f, _, _ in OPTIONS])
def test_a_value_no_command_accepts_is_refused_naming_the_option(
    command, flag, value, dest, tmp_path, capsys
):
    argv = [*command.split(), *(a.format(tmp=tmp_path) for a in REQUIRED.get(command, [])), flag, value]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, f"posenc {' '.join(argv)} exited {code}"
    assert "Traceback" not in err
    named = (flag, dest, dest.replace("_", "-"), flag.lstrip("-").replace("-", "_"))
    assert any(n in err for n in named), f"posenc {' '.join(argv)}: {err!r} does not name {flag}"
