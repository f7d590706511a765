"""Running a document's code blocks as a test: every ```python block in one namespace, in order, and every
line of every ```bash block as a command, in a scratch folder with posenc's console script on PATH."""

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


def run_blocks(doc: str, workdir: Path) -> int:
    """Run every block of ``doc`` in ``workdir``; returns how many ran. A failing block raises, naming it."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for n, (language, code) in enumerate(code_blocks(doc), 1):
            where = f"{doc}, code block {n} ({language})"
            if language == "python":
                exec(compile(code, where, "exec"), namespace)
            elif language == "bash":
                for line in code.splitlines():
                    command = line.split(" #", 1)[0].strip()
                    if command:
                        done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True)
                        assert done.returncode == 0, f"{where}: {command!r} failed:\n{done.stderr[-3000:]}"
            else:
                raise AssertionError(f"{where}: no way to run a {language!r} block")
        return n
    finally:
        os.chdir(cwd)
