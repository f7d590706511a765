"""Running a document's code blocks as a test: every ```python block in one namespace, in order, and every
line of every ```bash block as a command, in a scratch folder with posenc's console script on PATH.

A python block whose first line is ``# name.py`` is also saved as that file, for the commands after it.
A ```text block is what the python block before it prints, and is checked against that. Set-up commands
are checked rather than run: ``make TARGET`` by ``make -n TARGET`` in the repository (the
target exists and its recipe expands; ``make test`` is what CI runs, ``make demo`` the ten-minute main job),
``pip install`` by the extras it names existing in pyproject.toml (installing needs the network)."""

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def code_blocks(doc: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of ``doc`` (a path relative to the repository root)."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer((ROOT / doc).read_text())]


def _check_setup(command: str, where: str) -> None:
    if command.startswith("make "):
        for target in command.split()[1:]:
            done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
            assert done.returncode == 0, f"{where}: make has no target {target!r}: {done.stderr[-500:]}"
        return
    import tomllib  # Python 3.11+; the project's CI runs 3.11

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for names in re.findall(r"\.\[([a-z,]+)\]", command):
        for name in names.split(","):
            assert name in extras, (
                f"{where}: {command!r} names the extra {name!r}, which pyproject.toml lacks"
            )


def run_blocks(doc: str, workdir: Path) -> int:
    """Run every block of ``doc`` in ``workdir``; returns how many ran. A failing block raises, naming it."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    namespace: dict = {}
    n, printed = 0, io.StringIO()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for n, (language, code) in enumerate(code_blocks(doc), 1):
            where = f"{doc}, code block {n} ({language})"
            if language == "python":
                first = code.split("\n", 1)[0]
                if re.fullmatch(r"# [\w/]+\.py", first):  # a file to save, as the page says to
                    Path(first[2:]).write_text(code)
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    exec(compile(code, where, "exec"), namespace)
            elif language == "bash":
                for line in code.splitlines():
                    command = line.split(" #", 1)[0].strip()
                    if command.startswith(("make ", "pip install")):
                        for part in command.split("&&"):
                            _check_setup(part.strip(), where)
                    elif command:
                        done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True)
                        assert done.returncode == 0, f"{where}: {command!r} failed:\n{done.stderr[-3000:]}"
            elif language == "text":  # what the python block before it printed: checked, not run
                if code.strip() not in printed.getvalue():
                    raise AssertionError(f"{where}: the block before it printed\n{printed.getvalue()}")
            else:
                raise AssertionError(f"{where}: no way to run a {language!r} block")
        return n
    finally:
        os.chdir(cwd)
