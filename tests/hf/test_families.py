"""posenc.hf.families: one table of what posenc knows per transformers family; the tables the readers and
patchers use are views of it, so a family's facts cannot disagree between them."""

from posenc.hf import INTERLEAVED_MODEL_TYPES, PATCHED_FAMILIES, layers, plan
from posenc.hf.families import FAMILIES, Family, family


def test_each_model_type_has_one_entry():
    names = [f.model_type for f in FAMILIES]
    assert len(names) == len(set(names))


def test_every_family_patched_layer_by_layer_has_a_plan_reader_and_back():
    for f in FAMILIES:
        if f.attention is not None:
            assert f.plan is not None, f.model_type
            assert plan.READERS[f.model_type] is not None
    assert set(layers.ADAPTERS) <= set(plan.READERS)


def test_every_m_rope_family_has_its_text_model_and_the_same_pairing():
    for f in FAMILIES:
        if f.mrope is None:
            continue
        assert f.model_type in plan.MROPE_FAMILIES
        text = family(f"{f.model_type}_text") if f.composite else f  # NeoMME is its own language model
        if text.attention is not None:  # patched layer by layer, else through its rotary module
            # the hand-out form of the cos/sin for its layout
            assert text.attention.form == {"half": "half", "interleaved": "pairs"}[f.mrope.layout]
        assert (text.model_type in INTERLEAVED_MODEL_TYPES) == (f.mrope.layout == "interleaved")


def test_every_family_marked_tested_has_a_parity_test():
    # PATCHED_FAMILIES says the single-RoPE path is tested on these: tests/test_hf.py must build each
    import transformers

    from ..test_hf import MODELS

    built = {getattr(transformers, cfg_cls).model_type for cfg_cls, *_ in MODELS.values()}
    assert PATCHED_FAMILIES and set(PATCHED_FAMILIES) <= built
    assert family("no_such_model") == Family("no_such_model")  # nothing known: a bare entry


def test_the_readme_llama_3_1_example_runs_without_warnings():
    """The README's tiny Llama 3.1 left max_position_embeddings at LlamaConfig's 2048, below the
    original_max_position_embeddings 8192 of its llama3 scaling, and transformers warned of it twice."""
    import logging
    import warnings
    from pathlib import Path

    import torch

    import posenc

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = [b for b in readme.split("```python\n")[1:] if '"rope_type": "llama3"' in b.split("```")[0]]
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(code.split("```")[0], "README.md", "exec"), {"torch": torch, "posenc": posenc})
    finally:
        library.removeHandler(handler)
    assert not said and not [str(w.message) for w in caught], (said, [str(w.message) for w in caught])
