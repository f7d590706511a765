"""Every code block of these pages runs (the pages that need the real model: tests/real/test_real_docs.py)."""

import pytest

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
