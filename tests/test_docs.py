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
