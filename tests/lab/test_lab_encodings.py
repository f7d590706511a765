"""posenc.lab.encodings: the registry of positional encodings and the RoPE eval-time extensions."""

import posenc
from posenc.lab.config import GPTConfig
from posenc.lab.encodings import ENCODINGS, EXTENSIONS, Encoding, extension_scaling, register_encoding
from posenc.lab.model import GPT

SCHEMES = ["none", "sinusoidal", "learned", "rope", "alibi"]


def test_registry_has_the_five_schemes():
    assert set(SCHEMES) <= set(ENCODINGS)


def test_each_scheme_builds_the_modules_it_needs():
    cfg = GPTConfig(encoding="rope", n_layer=1, n_head=2, d_model=16, max_len=8)
    assert isinstance(ENCODINGS["rope"](cfg).rotary, posenc.RotaryEmbedding)
    assert isinstance(ENCODINGS["alibi"](cfg).alibi, posenc.ALiBi)
    assert isinstance(ENCODINGS["learned"](cfg).input, posenc.LearnedEmbedding)
    assert isinstance(ENCODINGS["sinusoidal"](cfg).input, posenc.SinusoidalEncoding)
    none = ENCODINGS["none"](cfg)
    assert isinstance(none.input, posenc.NoPositionalEncoding) and none.rotary is none.alibi is None


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


def test_extension_scaling_is_the_hugging_face_dict_of_each_method():
    assert list(EXTENSIONS) == ["pi", "ntk", "dynamic", "yarn"]
    assert extension_scaling("pi", 2.0, 64) == {"rope_type": "linear", "factor": 2.0}
    assert extension_scaling("ntk", 2.0, 64) == {"rope_type": "ntk", "factor": 2.0}
    assert extension_scaling("dynamic", 2.0, 64) == {"rope_type": "dynamic", "factor": 2.0}
    assert extension_scaling("yarn", 4.0, 64) == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
