"""The registry of context-extension methods (posenc.extension): one record per method, and the places that
name methods (posenc extend, the laboratory) are views of it."""

from __future__ import annotations

import pytest

from posenc import extension
from posenc.lab.extensions import EXTENSIONS, ROPE_EXTENSIONS
from posenc.real.methods import EXTEND_METHODS, REMAP_METHODS, method_remap
from posenc.remap import Remap


def test_extend_and_the_lab_name_the_registry_s_methods():
    assert list(EXTEND_METHODS) == ["none", *extension.METHODS]
    assert set(REMAP_METHODS) == {n for n, m in extension.METHODS.items() if m.kind == "remap"}
    assert set(ROPE_EXTENSIONS) == {n for n, m in extension.METHODS.items() if m.lab} <= set(EXTENSIONS)
    assert all(extension.METHODS[n].kind == "frequencies" for n in ROPE_EXTENSIONS)


@pytest.mark.parametrize("name", list(extension.METHODS))
def test_each_method_makes_one_thing_from_a_factor_and_a_trained_length(name):
    method = extension.get(name)
    if method.kind == "frequencies":
        scaling = method.scaling(4.0, 2048)
        assert scaling["rope_type"] == method.rope_type and scaling["factor"] == 4.0
        assert extension.TRAINED not in scaling.values()
        with pytest.raises(ValueError, match=f"{name} changes RoPE's frequencies"):
            method.remap_for(2048, 8192)
    elif method.kind == "layers":  # a layer conversion: neither a scaling nor a remap, its layers named
        assert method.without_rope and method.layers == "global"
        with pytest.raises(ValueError, match=f"{name} converts layers"):
            method.scaling(4.0, 2048)
    else:
        remap = method.remap_for(2048, 8192)
        assert isinstance(remap, Remap) and repr(remap) == repr(
            method_remap(name, train_len=2048, longest=8192)
        )
        with pytest.raises(ValueError, match=f"{name} remaps distances"):
            method.scaling(4.0, 2048)


def test_the_registry_refuses_a_taken_name_and_a_record_of_no_kind():
    with pytest.raises(ValueError, match="'yarn' exists already"):
        extension.register(extension.ExtensionMethod("yarn", "YaRN", "again", rope_type="yarn"))
    with pytest.raises(ValueError, match="'none' exists already"):
        extension.register(extension.ExtensionMethod("none", "none", "the model", rope_type="linear"))
    with pytest.raises(ValueError, match="exactly one of rope_type"):
        extension.register(extension.ExtensionMethod("neither", "neither", "nothing"))
    with pytest.raises(ValueError, match=r"method must be one of 'pi'.*got 'yarm'"):
        extension.get("yarm")
    assert "neither" not in extension.METHODS
