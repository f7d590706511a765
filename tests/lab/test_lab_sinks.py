"""The rope-sinks scheme: RoPE with a learned attention sink per head and layer (Xiao et al. 2023, as
GPT-OSS learns them) reaches posenc.attention's sinks, trains, and decodes like a full pass."""

import torch

from posenc.lab.config import GPTConfig
from posenc.lab.model import GPT


def model(encoding, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(encoding=encoding, n_layer=2, n_head=2, d_model=16, max_len=16)).eval()


def test_a_sink_with_no_weight_is_plain_rope_and_a_heavy_one_changes_every_row():
    sinks, rope = model("rope-sinks"), model("rope")
    rope.load_state_dict({k: v for k, v in sinks.state_dict().items() if not k.startswith("sinks.")})
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in sinks.sinks:
            p.fill_(-40.0)  # exp(-40): no weight on the sink
    torch.testing.assert_close(sinks(x), rope(x), rtol=0, atol=1e-6)
    with torch.no_grad():
        for p in sinks.sinks:
            p.fill_(3.0)
    assert (sinks(x) - rope(x)).abs().amax(-1).min() > 1e-4  # every position moves


def test_the_sinks_are_parameters_of_each_layer_and_learn():
    m = model("rope-sinks").train()
    assert [tuple(p.shape) for p in m.sinks] == [(2,), (2,)]
    assert [k for k in m.state_dict() if k.startswith("sinks.")] == ["sinks.0", "sinks.1"]
    x = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(2))
    m.loss(x[:, :-1], x[:, 1:]).backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in m.sinks)
