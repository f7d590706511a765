"""posenc.lab.encodings: the registry of positional encodings and the RoPE eval-time extensions."""

import posenc
from posenc.extension import extension_scaling
from posenc.lab.config import GPTConfig
from posenc.lab.encodings import ENCODINGS, EXTENSIONS, Encoding, register_encoding
from posenc.lab.model import GPT

SCHEMES = ["none", "sinusoidal", "learned", "rope", "alibi"]


def test_registry_has_the_five_schemes():
    assert set(SCHEMES) <= set(ENCODINGS)


def test_each_scheme_builds_the_modules_it_needs():
    cfg = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=8)
    assert isinstance(ENCODINGS["rope"](cfg).rotary, posenc.RotaryEmbedding)
    assert isinstance(ENCODINGS["alibi"](cfg).bias, posenc.ALiBi)
    assert isinstance(ENCODINGS["learned"](cfg).input, posenc.LearnedEmbedding)
    assert isinstance(ENCODINGS["sinusoidal"](cfg).input, posenc.SinusoidalEncoding)
    none = ENCODINGS["none"](cfg)
    assert isinstance(none.input, posenc.NoPositionalEncoding) and none.rotary is none.bias is None


def test_a_registered_encoding_is_a_valid_config_and_builds_a_model():
    @register_encoding("rope500")
    def _rope500(cfg):
        return Encoding(
            input=posenc.NoPositionalEncoding(), rotary=posenc.RotaryEmbedding(cfg.head_dim, base=500.0)
        )

    try:
        model = GPT(GPTConfig(encoding="rope500", n_layer=1, n_head=2, d_model=16, max_len=8))
        assert model.rotary.base == 500.0
    finally:
        del ENCODINGS["rope500"]


def test_each_eval_time_extension_is_the_hugging_face_dict_of_its_method():
    assert list(EXTENSIONS) == ["pi", "ntk", "dynamic", "yarn", "bca", "temp"]
    assert extension_scaling("pi", 2.0, 64) == {"rope_type": "linear", "factor": 2.0}
    assert extension_scaling("ntk", 2.0, 64) == {"rope_type": "ntk", "factor": 2.0}
    assert extension_scaling("dynamic", 2.0, 64) == {"rope_type": "dynamic", "factor": 2.0}
    assert extension_scaling("yarn", 4.0, 64) == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }


def test_all_expands_to_every_built_in_scheme_once():
    from posenc.lab.config import Settings
    from posenc.lab.encodings import BUILTIN

    assert Settings(schemes=("rope", "all")).schemes == ("rope", *[s for s in BUILTIN if s != "rope"])


USER_SCHEME = """
import posenc
from posenc.lab.encodings import Encoding


def halved_alibi(cfg):
    return Encoding(bias=posenc.ALiBi(cfg.n_head, slopes=posenc.alibi_slopes(cfg.n_head) / 2))
"""


def test_a_researchers_own_scheme_runs_in_compare_without_editing_posenc(corpus_dir, tmp_path):
    """--schemes path/to/file.py:function imports the builder in every worker process."""
    import json

    from posenc.cli import main

    from .test_lab_compare import tiny_compare_args

    user = tmp_path / "my_encodings.py"
    user.write_text(USER_SCHEME)
    spec = f"{user}:halved_alibi"
    args = tiny_compare_args(
        tmp_path / "run", corpus_dir, tmp_path / "cache", jobs=2, schemes=f"alibi,{spec}"
    )
    assert main(args) == 0
    rows = {
        r["scheme"]: r["ppl"] for r in json.loads((tmp_path / "run" / "results.json").read_text())["results"]
    }
    assert set(rows) == {"alibi", spec}
    assert rows[spec] != rows["alibi"]  # the slopes differ, so the trained models do


def test_the_score_bias_schemes_train_a_step_and_decode_like_a_full_pass():
    import torch

    for name in ("t5", "kerple", "sandwich", "fire"):
        cfg = GPTConfig(encoding=name, n_layer=1, n_head=2, d_model=16, max_len=8)
        model = GPT(cfg)
        idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
        loss = model.loss(idx[:, :-1], idx[:, 1:])
        loss.backward()
        grads = [p.grad for p in model.score_bias.parameters()]
        assert all(g is not None for g in grads), name  # the bias's own parameters learn
        cached = model.generate(idx[:, :6], 4, temperature=0.0)  # a KV cache: one position per step
        fresh = model.generate(idx[:, :6], 4, temperature=0.0, use_cache=False)  # a full pass per step
        assert torch.equal(cached, fresh), name
