"""The check ``patch_model(model, remap=)`` makes before patching: that posenc's remapped attention runs the
family's attention as the family's own code does, on a tiny float32 replica of the model.

A remap moves the rotation from the model's code into posenc's attention, so what the model's attention code
does besides RoPE (its pairing of rotary channels, NoPE layers, bidirectional attention, score soft-capping,
latent attention's split heads, anything else a family adds) must be what posenc does too. Rather than
knowing every family, the check builds the model's own class from its own config with the sizes made small
(:mod:`posenc.hf.tiny`), patches it with a remap that moves no distance (:class:`posenc.remap.NoRemap`), and
requires its logits, of a prefill and of two tokens decoded from its cache, to equal the unpatched
replica's to float32 rounding; anything else is refused with the gap it found or the error it raised.
Building and running the replica takes well under a second.
"""

from __future__ import annotations

import torch

from .tiny import MAX_PARAMETERS, shrunk

__all__ = ["check_replica", "decoded", "output_of"]

_PROBE = 12  # tokens


def _replica(model):
    config = model.config
    values = config.to_dict()
    values.pop("dtype", None)
    values.pop("torch_dtype", None)
    small = shrunk(values)
    for key in ("num_hidden_layers", "n_layer", "num_layers"):  # never more layers than the model has
        if isinstance(values.get(key), int) and key in small:
            small[key] = min(small[key], values[key])
    try:
        tiny = type(config)(**{**values, **small})
        with torch.device("meta"):
            size = sum(p.numel() for p in type(model)(tiny).parameters())
        if size > MAX_PARAMETERS:
            raise ValueError(f"{size / 1e6:.0f}M parameters after shrinking its config")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return type(model)(tiny).float().eval()
    except Exception as e:
        raise ValueError(
            "patch_model(remap=) checks that posenc reproduces a family's attention on a tiny replica built "
            f"from the model's class and config, and could not build one for {type(model).__name__}: {e}"
        ) from e


def output_of(out) -> torch.Tensor:
    """A forward's logits, or its last hidden state for a model without a head, in float32."""
    found = getattr(out, "logits", None)
    return (found if found is not None else out.last_hidden_state).float()


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return output_of(model(input_ids=ids, use_cache=False))


def _cache_of(out):
    """The cache a transformers forward returned (``cache`` in transformers 5, ``past_key_values`` before)."""
    found = getattr(out, "cache", None)
    return found if found is not None else getattr(out, "past_key_values", None)


def decoded(model, ids) -> torch.Tensor | None:
    """Outputs of the last two tokens of ``ids`` (1, n) decoded one at a time from the cache of a prefill
    of the others; None for a model that returns no cache. Raises whatever the model raises."""
    with torch.no_grad():
        cache = _cache_of(model(input_ids=ids[:, :-2], use_cache=True))
        if cache is None:
            return None
        steps = []
        for i in (-2, -1):
            out = model(input_ids=ids[:, i:][:, :1], cache=cache, use_cache=True)
            cache = _cache_of(out)
            steps.append(output_of(out))
    return torch.cat(steps, 1)


def check_replica(model, patch) -> None:
    """Refuse (ValueError) unless ``patch(replica)``, patch_model's remap path with a remap that moves no
    distance, leaves a tiny replica of ``model`` computing what it computed (module docstring)."""
    replica = _replica(model)
    vocab = getattr(replica.config.get_text_config(), "vocab_size", None) or 100
    ids = torch.randint(3, max(4, min(vocab, 100)), (1, _PROBE), generator=torch.Generator().manual_seed(0))
    name = getattr(model.config, "model_type", "") or type(model).__name__
    try:
        want = _logits(replica, ids)
    except Exception as e:
        raise ValueError(
            f"patch_model(remap=) could not run a tiny replica of {name} to check it: {e}"
        ) from e
    try:
        want_decoded = decoded(replica, ids)
    except Exception:  # the family's own code cannot decode this replica: prefill alone is checked
        want_decoded = None
    patch(replica)
    try:
        got = _logits(replica, ids)
    except Exception as e:
        raise ValueError(
            f"posenc's remapped attention cannot run {name}'s attention (a tiny replica, patched, raised "
            f"{type(e).__name__}: {e})"
        ) from e
    if want_decoded is not None:
        try:
            got_decoded = decoded(replica, ids)
        except Exception as e:
            raise ValueError(
                f"posenc's remapped attention cannot decode {name} from its cache (a tiny replica, patched, "
                f"raised {type(e).__name__}: {e})"
            ) from e
        want, got = torch.cat((want, want_decoded), 1), torch.cat((got, got_decoded), 1)
    gap, scale = (got - want).abs().max().item(), want.abs().max().item()
    if not gap <= 1e-4 * scale + 1e-6:  # float32 rounding is ~1e-6 of the scale; NaN refused too
        raise ValueError(
            f"posenc's remapped attention does not reproduce {name}'s own attention: with a remap that "
            f"moves no distance a tiny replica's logits moved by {gap:.2g} (of {scale:.2g}); its attention "
            "code does something besides RoPE that the remap kernels do not"
        )
