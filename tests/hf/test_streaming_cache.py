"""posenc.hf.streaming_cache: StreamingLLM in a transformers model patched with remap=. A one-layer model's
logits at each step equal a fresh forward pass of the unpatched model over the kept tokens; generate runs
with it; refusals."""

import pytest
import torch

from posenc.hf import patch_model, streaming_cache, unpatch_model
from posenc.remap import NoRemap, SelfExtend

from .test_remap_models import tiny_llama


def _kept(n_seen: int, sinks: int, window: int) -> list[int]:
    """The token indices StreamingLLM keeps after n_seen tokens, one at a time."""
    if n_seen <= sinks + window:
        return list(range(n_seen))
    return list(range(sinks)) + list(range(n_seen - window, n_seen))


@torch.no_grad()
@pytest.mark.parametrize("remap", [NoRemap(), SelfExtend(2, 3)], ids=repr)
def test_each_step_is_a_fresh_forward_over_the_kept_tokens(remap):
    """NoRemap: StreamingLLM itself, against the model as it was; SelfExtend groups absolute positions, so
    it shows whether the kept keys sit at their cache positions."""
    model = tiny_llama(layers=1)
    ids = torch.randint(1, 128, (1, 30))
    if isinstance(remap, NoRemap):
        fresh = {t: model(ids[:, _kept(t + 1, 2, 6)]).logits[:, -1] for t in range(5, 30)}
        patch_model(model, remap=remap)
    else:
        patch_model(model, remap=remap)
        fresh = {t: model(ids[:, _kept(t + 1, 2, 6)]).logits[:, -1] for t in range(5, 30)}
    cache = streaming_cache(model, sink_tokens=2, window=6)
    model(ids[:, :5], cache=cache, use_cache=True)
    for t in range(5, 30):
        got = model(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
        torch.testing.assert_close(got, fresh[t], rtol=1e-5, atol=1e-5)
        assert cache.layers[0].keys.shape[-2] == len(_kept(t + 1, 2, 6))
    unpatch_model(model)


@torch.no_grad()
def test_generate_streams_past_the_window_and_bad_use_is_refused():
    model = tiny_llama()
    with pytest.raises(ValueError, match="streaming_cache needs a model patched with"):
        streaming_cache(model)
    patch_model(model, remap=NoRemap())
    cache = streaming_cache(model, sink_tokens=2, window=6)
    out = model.generate(torch.randint(1, 128, (1, 5)), cache=cache, max_new_tokens=20, min_new_tokens=20)
    assert out.shape == (1, 25) and cache.layers[0].keys.shape[-2] == 8
    with pytest.raises(ValueError, match="at most window=6 new tokens per call, got 7"):
        model(torch.randint(1, 128, (1, 7)), cache=streaming_cache(model, 2, 6), use_cache=True)
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        streaming_cache(model, 2, 0)
    unpatch_model(model)
