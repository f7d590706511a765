"""docs/real-models.md: every code block runs, on the real model."""

from ..docs_blocks import run_blocks


def test_every_code_block_of_the_real_models_page_runs(smollm2_folder, tmp_path):
    assert run_blocks("docs/real-models.md", tmp_path) == 5
