"""posenc.hf.ledger: every way patch_model changes a model (a rotary module's hand-out, per-layer plans, a
remap) is recorded in one ledger, and unpatch_model leaves the model exactly as it was: the same attributes,
submodules and hooks on every module, the same attention implementation, the same logits."""

import pytest
import torch
import transformers

import posenc
from posenc.hf import patch_model, unpatch_model
from posenc.hf.ledger import Ledger, is_patched

from . import families


def llama():
    config = transformers.LlamaConfig(**families.COMMON)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def snapshot(model) -> dict:
    """What a patch could leave behind: per module its own attributes (by identity), submodules, hooks."""
    out = {"attn": model.config._attn_implementation}
    for name, m in model.named_modules():
        out[name] = (
            {k: id(v) for k, v in vars(m).items() if not k.startswith("_")},
            dict(m._modules),
            (len(m._forward_hooks), len(m._forward_pre_hooks)),
        )
    return out


@pytest.mark.parametrize(
    "build, patch",
    [
        (llama, {}),  # the rotary module's hand-out
        (llama, {"remap": posenc.SelfExtend(2, 8)}),  # the remap attention
        (lambda: families.build("gemma3")[0], {}),  # per-layer plans and their hooks
    ],
    ids=["rotary", "remap", "plan"],
)
def test_unpatch_leaves_the_model_as_it_was(build, patch):
    model = build()
    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    before, logits = snapshot(model), model(input_ids=ids).logits
    patch_model(model, **patch)
    assert is_patched(model) and snapshot(model) != before
    with pytest.raises(ValueError, match="already patched"):
        patch_model(model, **patch)
    unpatch_model(model)
    assert not is_patched(model) and snapshot(model) == before
    torch.testing.assert_close(model(input_ids=ids).logits, logits, rtol=0, atol=0)


def test_a_refused_patch_leaves_no_ledger():
    model = llama()
    with pytest.raises(ValueError):
        patch_model(model, rotary=posenc.RotaryEmbedding(8))  # the wrong head size for this model
    assert not is_patched(model)


def test_the_ledger_puts_back_own_attributes_properties_and_deletes_new_ones():
    class Config:
        def __init__(self):
            self._mode = "a"

        @property
        def mode(self):
            return self._mode

        @mode.setter
        def mode(self, value):
            self._mode = value

    module, config = torch.nn.Linear(2, 2), Config()
    book = Ledger()
    book.set(module, "in_features", 7)  # its own attribute
    book.set(module, "extra", torch.nn.Identity())  # new: a submodule
    book.set(module, "forward", lambda x: x)  # new: shadows the class's method
    book.set(config, "mode", "b")  # a property
    book.hook(module.register_forward_hook(lambda *a: None))
    assert module.in_features == 7 and "extra" in module._modules and config.mode == "b"
    book.undo()
    assert module.in_features == 2 and "extra" not in module._modules and "forward" not in vars(module)
    assert config.mode == "a" and not module._forward_hooks


def test_a_rotary_embedding_subclass_is_refused_by_patch_model_and_consistent_cache():
    """A RotaryEmbedding subclass (xPos, whose keys are scaled otherwise than its queries, or a user's own)
    cannot be carried by the cos/sin a model's rotary module hands out: refused, nothing patched."""
    from posenc.hf import consistent_cache

    class Shifted(posenc.RotaryEmbedding):
        def forward(self, q, k, **kwargs):
            return super().forward(q, k, offset=1)

    model = llama()
    xpos = posenc.XPos(16, layout="half")
    for rotary, message in ((xpos, "does more than rotate"), (Shifted(16), "subclass")):
        for remap in (None, posenc.SelfExtend(1, 1 << 20)):
            with pytest.raises(ValueError, match=message):
                patch_model(model, rotary=rotary, remap=remap)
            assert not any(hasattr(m, "posenc_rotary") for m in model.modules())
        with pytest.raises(ValueError, match=message):
            consistent_cache(model, rotary)
