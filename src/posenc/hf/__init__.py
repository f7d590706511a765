"""Hugging Face transformers interop (optional dependency: ``pip install posenc[hf]``).

- :func:`rotary_from_config`: a :class:`posenc.RotaryEmbedding` with exactly the RoPE a transformers config
  (object or config.json dict) describes: head_dim, rope_theta, partial rotary, the ``rope_scaling`` /
  ``rope_parameters`` method, and the pairing layout that model family's code uses.
- :func:`position_plan`: what every layer does with positions (RoPE with which base and scaling, M-RoPE,
  none; full, sliding or chunked attention; query temperature), read from the config (Llama 4, Gemma 3,
  Cohere2, SmolLM3, DeepSeek V3, Qwen2-VL / 2.5-VL / 3-VL, and every single-RoPE family).
- :func:`patch_model`: run a transformers model with posenc computing its positions (float64 angles,
  per-call context for dynamic methods; per layer as its plan says); :func:`unpatch_model` undoes it.
- :func:`consistent_cache`: a transformers ``DynamicCache`` that re-rotates the cached keys whenever a
  length-dependent schedule (dynamic NTK, dynamic YaRN, LongRoPE) changes, so cached keys and the new
  query always share one schedule (see :mod:`posenc.rope.cache`).
- :func:`context_parallel`: a model's forward with its sequence sharded over torch.distributed ranks, every
  attention layer on :func:`posenc.parallel.ring_attention` (windows and sinks kept).
- :func:`streaming_cache`: StreamingLLM's cache (attention sinks and a recent window, positions counted in
  the cache) for a model patched with ``remap=``.

transformers itself is only imported by the caller: nothing here needs it at import time.
"""

from ._config import INTERLEAVED_MODEL_TYPES, rope_settings, rotary_from_config
from .cache import consistent_cache
from .context_parallel import ContextParallel, context_parallel
from .handout import PATCHED_FAMILIES
from .patch import patch_model, unpatch_model
from .plan import LayerPlan, QueryTemperature, Rope, position_plan, text_config
from .streaming import streaming_cache

__all__ = [
    "INTERLEAVED_MODEL_TYPES",
    "ContextParallel",
    "PATCHED_FAMILIES",
    "LayerPlan",
    "QueryTemperature",
    "Rope",
    "consistent_cache",
    "context_parallel",
    "patch_model",
    "position_plan",
    "rope_settings",
    "rotary_from_config",
    "streaming_cache",
    "text_config",
    "unpatch_model",
]
