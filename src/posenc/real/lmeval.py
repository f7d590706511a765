"""lm-evaluation-harness on a posenc-patched model: :func:`posenc_lm`.

lm-evaluation-harness (Gao et al., EleutherAI, "A framework for few-shot language model evaluation",
Zenodo, doi:10.5281/zenodo.10256836) runs a transformers model through its ``HFLM`` class, which also takes
a model object. :func:`posenc_lm` patches a model with a context-extension method
(:func:`posenc.hf.patch_model`, as ``posenc extend`` would) and hands it to ``HFLM`` with a context long
enough for the extension, so that ``lm_eval.simple_evaluate(model=posenc_lm(...), tasks=[...])`` scores the
extended model::

    import lm_eval
    from posenc.real import load_real_model
    from posenc.real.lmeval import posenc_lm

    real = load_real_model("smollm2-135m")  # trained at 8192 tokens
    lm = posenc_lm(real, method="yarn", factor=2)  # patched; lm-eval's context is 16384 tokens
    results = lm_eval.simple_evaluate(model=lm, tasks=["niah_single_1"], limit=20,
                                      metadata={"tokenizer": real.info["folder"],
                                                "max_seq_lengths": [8192, 16384]})

The patch stays on the model as long as it is used; ``posenc.hf.unpatch_model(real.model)`` undoes it.
Needs the ``lmeval`` extra: ``pip install posenc[lmeval]``.

RULER offline
-------------
lm-eval's RULER tasks (Hsieh et al. 2024, arXiv:2404.06654; the ``ruler`` group) build their prompts when
they are loaded, each sized with a tokenizer to every length of ``max_seq_lengths``, 500 per length (pass
``limit=`` to run fewer). posenc downloads nothing; to run them without a network:

- ``pip install "lm-eval[ruler]"`` (wonderwords, nltk), and nltk's ``punkt_tab`` data once while online
  (``python -m nltk.downloader punkt_tab``): the niah tasks try to fetch it when they are imported.
- The tasks load their tokenizer by name (``AutoTokenizer.from_pretrained``): give a local folder in
  ``metadata={"tokenizer": ...}``; for :func:`posenc.real.load_real_model`'s model, ``real.info["folder"]``
  (the converted model folder, which holds the tokenizer).
- niah_single_1, niah_multikey_2, niah_multikey_3, ruler_vt, ruler_cwe and ruler_fwe generate everything.
  niah_single_2, niah_single_3, niah_multikey_1, niah_multivalue and niah_multiquery read Paul Graham's
  essays, the Hub dataset ``baber/paul_graham_essays``, from the ``datasets`` cache (load it once while
  online). ruler_qa_squad and ruler_qa_hotpot download their JSON on every run: they cannot run offline.
- Set ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1`` so that a missing file fails instead of downloading.
- ``max_length`` (default: the factor times the trained length) must be at least the largest of
  ``max_seq_lengths``: lm-eval cuts longer prompts from the left.
"""

from __future__ import annotations

import math
import re

import torch

from posenc.hf import patch_model, unpatch_model
from posenc.real.layers import DEFAULT_LAYERS
from posenc.real.loader import RealModel
from posenc.real.methods import Treatment, check_applicable, check_extendable, trained_length, treatment

__all__ = ["INSTALL_EXTRA", "posenc_lm"]

INSTALL_EXTRA = "pip install posenc[lmeval]"
_AUTO_BATCH = re.compile(r"auto(:\d+)?")


def posenc_lm(
    model,
    tokenizer=None,
    *,
    method: str | None = None,
    factor: float | None = None,
    train_len: int | None = None,
    max_length: int | None = None,
    layers: str = DEFAULT_LAYERS,
    batch_size: int | str = 1,
):
    """An lm-evaluation-harness model (``lm_eval.models.huggingface.HFLM``, an ``lm_eval.api.model.LM``)
    that runs ``model`` with posenc computing its positions; pass it to
    ``lm_eval.simple_evaluate(model=...)``.

    ``model``: a transformers causal LM with RoPE, or a :class:`posenc.real.RealModel` (its tokenizer is
    then the default ``tokenizer``). ``tokenizer``: the model's transformers tokenizer (lm-eval sets its pad
    token when it has none).

    ``method``: a method spec of ``posenc extend --methods`` (:data:`posenc.real.EXTEND_METHODS`, e.g.
    "yarn", "pi", "selfextend", "none", or per-layer "yarn@global": :mod:`posenc.real.layers`; ``layers``
    as ``--layers``), applied as :func:`posenc.real.methods.treatment` builds it and kept on ``model`` for
    the adapter's lifetime: undo it with ``posenc.hf.unpatch_model(model)``. A model that is already
    patched is refused. ``factor``: the extension factor over ``train_len`` (default the config's trained
    length, :func:`posenc.real.trained_length`); ``max_length``: the longest context lm-eval feeds
    (``batch x max_length`` tokens per forward; default the factor times ``train_len``, rounded down; the
    factor defaults to ``max_length / train_len``, at least 1). One of the two is needed with a method.

    ``method=None`` runs ``model`` as it is: patched by the caller (``posenc.hf.patch_model(model, rotary=,
    remap=, plan=)``), or not at all; give ``max_length`` then, else lm-eval takes the config's
    ``max_position_embeddings``. ``batch_size``: a positive int, or "auto" / "auto:N" (lm-eval's search);
    1 with a training-free remap (SelfExtend, ReRoPE, ...), which runs unpadded sequences only.

    The returned object carries ``posenc_treatment``: the :class:`posenc.real.methods.Treatment` applied
    (None without a method); ``.lines()`` says what each layer runs. A ValueError names the argument,
    the value and what is allowed; one names ``pip install posenc[lmeval]`` when lm-eval is missing.
    """
    model, tokenizer = _model_and_tokenizer(model, tokenizer)
    _check_numbers(factor=factor, train_len=train_len, max_length=max_length, batch_size=batch_size)
    if method is None and (factor is not None or train_len is not None):
        raise ValueError(
            f"factor={factor!r} and train_len={train_len!r} go with method=; without a method the model runs "
            "as it is (patch it with posenc.hf.patch_model and give max_length=)"
        )
    if method is not None and not isinstance(method, str):
        raise ValueError(f"method must be a method spec (str) such as 'yarn' or None; got {method!r}")
    hflm = _hflm_class(tokenizer)
    chosen = None
    if method is not None:
        chosen, max_length = _treatment(model, method, factor, train_len, max_length, layers)
        if chosen.remap is not None and batch_size != 1:
            raise ValueError(
                f"batch_size must be 1 with method={method!r}: a remapped model runs unpadded sequences "
                f"only; got {batch_size!r}"
            )
        _patch(model, chosen)
    try:
        lm = hflm(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    except BaseException:
        if chosen is not None:
            unpatch_model(model)  # a failed adapter leaves the model as it was given
        raise
    lm.posenc_treatment = chosen
    return lm


def _model_and_tokenizer(model, tokenizer):
    """The transformers model and tokenizer that ``model`` and ``tokenizer`` mean."""
    if isinstance(model, RealModel):
        tokenizer = model.tokenizer if tokenizer is None else tokenizer
        model = model.model
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise ValueError(
            "model must be a transformers causal LM (a torch.nn.Module with a .config) or a "
            f"posenc.real.RealModel; got {type(model).__name__}"
        )
    if tokenizer is None:
        raise ValueError("tokenizer is required with a transformers model: give the model's tokenizer")
    return model, tokenizer


def _check_numbers(*, factor, train_len, max_length, batch_size) -> None:
    """A ValueError naming the first argument that is not what :func:`posenc_lm` takes."""
    number = isinstance(factor, int | float) and not isinstance(factor, bool)
    if factor is not None and not (number and math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor must be a finite number >= 1 or None; got {factor!r}")
    for name, value, least in (("train_len", train_len, 2), ("max_length", max_length, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name} must be an int >= {least} or None; got {value!r}")
    is_int = isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1
    if not is_int and not (isinstance(batch_size, str) and _AUTO_BATCH.fullmatch(batch_size)):
        raise ValueError(f"batch_size must be an int >= 1, 'auto' or 'auto:N'; got {batch_size!r}")


def _hflm_class(tokenizer):
    """lm-eval's HFLM, imported here so that ``import posenc.real`` never imports lm-eval; a ValueError
    naming the extra when it is missing, or when ``tokenizer`` is of a kind HFLM does not take."""
    try:
        import lm_eval  # noqa: F401  (its absence is what the message below names)
        import transformers
        from lm_eval.models.huggingface import HFLM
    except ImportError as err:
        raise ValueError(f"posenc_lm needs lm-evaluation-harness: {INSTALL_EXTRA} ({err})") from err
    kinds = (transformers.PreTrainedTokenizer, transformers.PreTrainedTokenizerFast)
    if not isinstance(tokenizer, kinds):
        raise ValueError(
            "tokenizer must be a transformers PreTrainedTokenizer or PreTrainedTokenizerFast (what lm-eval's "
            f"HFLM takes); got {type(tokenizer).__name__}"
        )
    return HFLM


def _treatment(model, method, factor, train_len, max_length, layers) -> tuple[Treatment, int]:
    """The :class:`Treatment` of ``method`` for ``model`` and the context lm-eval is to feed it."""
    if factor is None and max_length is None:
        raise ValueError(
            f"method={method!r} needs factor= (the extension factor) or max_length= (the context to "
            "extend to)"
        )
    config = model.config
    try:
        check_extendable(config)
        train_len = trained_length(config) if train_len is None else train_len
        factor = float(factor) if factor is not None else max(1.0, max_length / train_len)
        max_length = max_length if max_length is not None else math.floor(factor * train_len)
        longest = max_length
        chosen = treatment(config, method, factor=factor, train_len=train_len, longest=longest, layers=layers)
        check_applicable(config, method, chosen.remap)
    except ValueError as err:
        raise ValueError(f"method={method!r} cannot run on this {type(model).__name__}: {err}") from err
    return chosen, max_length


def _patch(model, chosen: Treatment) -> None:
    """``model`` patched as ``chosen`` says, for as long as the adapter runs (so no context manager)."""
    if chosen.plan is not None:
        patch_model(model, plan=chosen.plan)
    else:
        patch_model(model, rotary=chosen.rotary, remap=chosen.remap)
