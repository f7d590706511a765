"""The one way posenc changes a transformers model: a :class:`Ledger` of every attribute it sets and every
hook it registers, kept on the patched model, so that :func:`~posenc.hf.unpatch_model` undoes whatever
path patched it (a rotary module's hand-out, per-layer plans, a remap) by undoing the ledger."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["Ledger", "is_patched", "ledger", "undo", "use_attention"]

_NAME = "_posenc_ledger"


class Ledger:
    """Changes to a model, in order, each with how to take it back."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, obj, name: str, value) -> None:
        """``obj.name = value``, remembering what was there: an attribute of the object itself (or a
        submodule) is put back, a property is set back, anything else is deleted so the class's shows."""
        self._undo.append(_restorer(obj, name))
        setattr(obj, name, value)

    def hook(self, handle) -> None:
        """A registered hook's handle, removed on undo."""
        self._undo.append(handle.remove)

    def undo(self) -> None:
        """Take back every change, the last first."""
        while self._undo:
            self._undo.pop()()


def _restorer(obj, name: str) -> Callable[[], None]:
    own = name in vars(obj) or (
        isinstance(obj, nn.Module) and any(name in d for d in (obj._modules, obj._parameters, obj._buffers))
    )
    if own or isinstance(getattr(type(obj), name, None), property):
        old = getattr(obj, name)
        return lambda: setattr(obj, name, old)
    return lambda: delattr(obj, name)


def use_attention(book: Ledger, configs, name: str, forward, mask) -> None:
    """Register ``forward`` as transformers' attention implementation ``name`` (``mask`` as its mask
    function: transformers' mask-function protocol) and set it on every config of ``configs``, each change
    into ``book``: the one way posenc's attention implementations reach a model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, mask)
    for config in configs:
        book.set(config, "_attn_implementation", name)


def ledger(model) -> Ledger:
    """The ledger of ``model``, new when it has none."""
    found = vars(model).get(_NAME)
    if found is None:
        found = Ledger()
        object.__setattr__(model, _NAME, found)
    return found


def is_patched(model) -> bool:
    """Whether ``model`` or any of its submodules holds posenc's changes."""
    return any(_NAME in vars(m) for m in model.modules())


def undo(model) -> bool:
    """Undo the ledgers of ``model`` and its submodules; True if there was anything to undo."""
    found = False
    for module in model.modules():
        book = vars(module).pop(_NAME, None)
        if book is not None:
            book.undo()
            found = True
    return found
