"""What the newest releases of posenc's dependencies change: the report behind ``make test-latest``.

``make install`` installs the pinned set (``requirements/pinned.txt``); ``make test-latest`` installs the
newest releases the package's ranges allow into a second environment and runs this module there::

    python -m posenc.tools.latest --pinned requirements/pinned.txt --docs docs/models.md --out runs/latest

It writes, under ``--out``: ``pinned.txt`` (the environment's exact versions, in the pinned file's form),
``models.md`` (docs/models.md with the zoo table as this environment's sweep finds it), ``junit.xml`` (the
test suite's results) and ``report.md``: the versions that moved, the zoo rows that are new, gone or
changed, and the tests that failed. Moving the pin is then a decision with a diff: copy ``pinned.txt`` over
the pinned file and ``models.md`` over docs/models.md once the report's failures are understood.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from importlib import metadata
from pathlib import Path

__all__ = ["failed_tests", "freeze", "main", "moved_versions", "pinned_versions", "zoo_changes", "zoo_rows"]

_NOT_PINNED = {"posenc", "pip", "setuptools", "wheel"}
_ROW = re.compile(r"^\| ([^ |]+) \|.*\|$", re.M)


def pinned_versions(text: str) -> dict[str, str]:
    """``name==version`` lines of a pinned file (comments and blank lines skipped), by lower-case name."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[_canonical(name)] = version.strip()
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def freeze() -> dict[str, str]:
    """Every distribution installed in this environment but posenc itself and the installers (as ``pip
    freeze`` lists them), by canonical name, with any local version label (torch's ``+cpu``) dropped so
    that the pin stays portable across indexes. Where a name is found twice (a vendored copy that a tool
    put on ``sys.path``), the first on the path: the one ``import`` loads."""
    found = {}
    for dist in metadata.distributions():
        name = _canonical(dist.metadata["Name"] or "")
        if name and name not in _NOT_PINNED:
            found.setdefault(name, dist.version.split("+", 1)[0])
    return found


def moved_versions(pinned: dict[str, str], now: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(name, pinned version or "-", installed version or "-")`` for every package that differs."""
    names = sorted(set(pinned) | set(now))
    return [(n, pinned.get(n, "-"), now.get(n, "-")) for n in names if pinned.get(n) != now.get(n)]


def zoo_rows(markdown_text: str, begin: str, end: str) -> dict[str, str]:
    """The zoo table's rows between the markers, by model type."""
    if begin not in markdown_text or end not in markdown_text:
        raise ValueError(f"the zoo table's markers {begin} ... {end} are missing")
    table = markdown_text[markdown_text.index(begin) : markdown_text.index(end)]
    return {m.group(1): m.group(0) for m in _ROW.finditer(table)}


def zoo_changes(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str]]:
    """Model types whose row is new, gone or changed between two zoo tables."""
    return {
        "new": sorted(set(after) - set(before)),
        "gone": sorted(set(before) - set(after)),
        "changed": sorted(t for t in set(before) & set(after) if before[t] != after[t]),
    }


def failed_tests(junit: Path) -> list[str]:
    """The ids of the tests a JUnit XML file records as failed or in error."""
    failed = []
    for case in ElementTree.parse(junit).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return failed


def _pinned_file(header: str, versions: dict[str, str]) -> str:
    body = [f"{name}=={version}" for name, version in sorted(versions.items())]
    return header + "\n".join(body) + "\n"


def _header(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def _report(moved, changes, before_rows, after_rows, failures, zoo_code) -> str:
    lines = ["# The newest releases against the pinned set", ""]
    lines += ["## Versions that moved", ""]
    if moved:
        lines += ["| package | pinned | newest |", "|---|---|---|"]
        lines += [f"| {n} | {a} | {b} |" for n, a, b in moved]
    else:
        lines.append("none")
    lines += ["", "## The transformers zoo", ""]
    lines.append(f"`posenc zoo` exited {zoo_code}" + (" (a family failed)" if zoo_code else ""))
    for kind in ("new", "gone", "changed"):
        lines += ["", f"### {kind} rows ({len(changes[kind])})", ""]
        for t in changes[kind]:
            if kind != "new":
                lines.append(f"- pinned: `{before_rows[t]}`")
            if kind != "gone":
                lines.append(f"- newest: `{after_rows[t]}`")
    lines += ["", f"## Tests that failed ({len(failures)})", ""]
    lines += [f"- `{t}`" for t in failures] or ["none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.tools.latest", description=__doc__.split("\n")[0])
    parser.add_argument("--pinned", type=Path, required=True, help="the pinned file, requirements/pinned.txt")
    parser.add_argument("--docs", type=Path, required=True, help="the zoo table's page, docs/models.md")
    parser.add_argument("--out", type=Path, required=True, help="a folder for the report and its files")
    parser.add_argument("--pytest-args", default="-q -n 2", help="how to run the suite (default: -q -n 2)")
    args = parser.parse_args(argv)
    from .zoo import BEGIN, END

    for name, path in (("--pinned", args.pinned), ("--docs", args.docs)):
        if not path.is_file():
            parser.error(f"{name} {path}: not a file")
    before_rows = zoo_rows(args.docs.read_text(), BEGIN, END)
    args.out.mkdir(parents=True, exist_ok=True)
    pinned_text = args.pinned.read_text()
    now = freeze()
    (args.out / "pinned.txt").write_text(_pinned_file(_header(pinned_text), now))

    models = args.out / "models.md"
    shutil.copyfile(args.docs, models)
    zoo = [sys.executable, "-m", "posenc.cli", "zoo", "--quiet", "--docs", str(models)]
    zoo_code = subprocess.call([*zoo, "--json", str(args.out / "zoo.json")])
    after_rows = zoo_rows(models.read_text(), BEGIN, END)

    junit = args.out / "junit.xml"
    subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args.split(), f"--junitxml={junit}"])
    failures = failed_tests(junit) if junit.is_file() else ["(the suite wrote no results)"]

    moved = moved_versions(pinned_versions(pinned_text), now)
    report = _report(moved, zoo_changes(before_rows, after_rows), before_rows, after_rows, failures, zoo_code)
    (args.out / "report.md").write_text(report)
    print(report)
    print(f"written: {args.out / 'report.md'}, {args.out / 'pinned.txt'}, {models}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
