"""Every code block of these pages runs (the pages that need the real model: tests/real/test_real_docs.py)."""

import inspect
import re
from pathlib import Path

import pytest

import posenc

from .docs_blocks import code_blocks, run_blocks

PAGES = [
    "README.md",
    "docs/architecture.md",
    "docs/context-extension.md",
    "docs/lab.md",
    "docs/models.md",
    "docs/parallel.md",
    "docs/relative-biases.md",
]


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_of_the_page_runs(page, tmp_path):
    assert run_blocks(page, tmp_path) == len(code_blocks(page)) > 0


# ``attention(...)`` as the docs quote it: a call or a signature whose keywords are written ``name=``
_QUOTED_CALL = re.compile(r"\battention\(([^()]*)\)")
_KEYWORD = re.compile(r"\b([a-z_]+)=")


def quoted_attention_keywords(text: str) -> list[tuple[str, str]]:
    """(the quoted call, a keyword it names) for every ``attention(...)`` in ``text``."""
    return [(m.group(0), k) for m in _QUOTED_CALL.finditer(text) for k in _KEYWORD.findall(m.group(1))]


def test_every_attention_keyword_the_docs_quote_is_one_attention_takes():
    """README, docs/ and the docstrings quote posenc.attention's keywords (``attention(q, k, v, rotary=,
    bias=)``); each must be a parameter of the function as it is."""
    takes = set(inspect.signature(posenc.attention).parameters)
    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *(root / "docs").glob("*.md"), *(root / "src" / "posenc").rglob("*.py")]
    quoted = [(p.relative_to(root), c, k) for p in pages for c, k in quoted_attention_keywords(p.read_text())]
    assert len(quoted) > 20  # the pages were read
    wrong = [f"{page}: {call} names {k}=" for page, call, k in quoted if k not in takes]
    assert not wrong, "\n".join(wrong)


def test_the_signature_check_reads_keywords_as_written():
    text = "as `attention(q, k, v, rotary=, log_forget=)` and posenc.attention(q, k, v, bias=alibi)"
    assert [k for _, k in quoted_attention_keywords(text)] == ["rotary", "log_forget", "bias"]


# ``[text](target)`` of a markdown page, and the ``docs/NAME.md`` that code and pages name in plain text
_LINK = re.compile(r"\]\(([^()\s]+)\)")
_DOC_NAMED = re.compile(r"\bdocs/[a-z][a-z0-9_.-]*\.md\b")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, and
    -1, -2, ... on a repeat (code blocks' ``#`` lines are no headings)."""
    anchors, repeats = set(), {}
    for line in _FENCE.sub("", text).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = repeats[slug] = repeats.get(slug, -1) + 1
            anchors.add(f"{slug}-{n}" if n else slug)
    return anchors


def test_every_link_of_the_pages_reaches_a_file_and_heading_of_the_repository():
    """README's and docs/'s relative links name a file inside the repository and, after ``#``, one of its
    headings; a moved section or page fails here, not on a reader."""
    root = Path(__file__).resolve().parents[1]
    wrong, n = [], 0
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in _LINK.findall(_FENCE.sub("", page.read_text())):
            if "://" in target or target.startswith("mailto:"):
                continue
            n += 1
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.is_relative_to(root) or not file.exists():
                wrong.append(f"{page.relative_to(root)}: {target} names no file of the repository")
            elif anchor and anchor not in heading_anchors(file.read_text()):
                wrong.append(f"{page.relative_to(root)}: {target} names no heading of {path or page.name}")
    assert n > 10 and not wrong, "\n".join(wrong)


def test_every_docs_page_that_code_or_pages_name_exists():
    """``docs/NAME.md`` in README, docs/, the docstrings and help texts, and the tests is a page there."""
    root = Path(__file__).resolve().parents[1]
    files = [root / "README.md", *(root / "docs").glob("*.md"), *(root / "src").rglob("*.py")]
    files += (root / "tests").rglob("*.py")
    named = {(f.relative_to(root), d) for f in files for d in _DOC_NAMED.findall(f.read_text())}
    assert len(named) > 10
    missing = sorted(f"{f}: {d}" for f, d in named if not (root / d).is_file())
    assert not missing, "\n".join(missing)


def test_heading_anchors_are_githubs():
    text = "# The lab\n## What `--seeds 3` measured (1367 s)\n```python\n# not.py\n```\n## The lab\n"
    assert heading_anchors(text) == {"the-lab", "what---seeds-3-measured-1367-s", "the-lab-1"}
