"""The modeling code transformers has for a model type: what posenc reads where a config alone cannot say
what the model does with positions (which families build rotary modules, which lay out M-RoPE sections)."""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["modeling_source"]


@functools.cache
def modeling_source(model_type: str) -> str:
    """The text of every ``modeling_*.py`` of ``model_type``'s folder in transformers ("" when it has none).
    A composite's text model type (``qwen3_omni_moe_text``) reads its parent's folder."""
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    models = Path(transformers.__file__).parent / "models"
    for name in (model_type, model_type.removesuffix("_text")):
        folder = models / model_type_to_module_name(name)
        if folder.exists():
            return "".join(p.read_text() for p in sorted(folder.glob("modeling_*.py")))
    return ""
