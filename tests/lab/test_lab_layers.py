"""posenc.lab.layers and posenc.lab.layered: per-layer plans, the schemes whose layers differ (SWAN, Gemma's
local/global, SmolLM3, partial RoPE, RoPE at Men et al.'s bound), and the DroPE recipes."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc.cli import main
from posenc.lab.config import GPTConfig
from posenc.lab.encoding import sliding_causal_mask
from posenc.lab.errors import LabError
from posenc.lab.layers import parse_plan
from posenc.lab.model import GPT, _per_layer
from posenc.lab.recipes import RECIPES

NAMED = ("swan", "gemma-local-global", "smollm3", "p-rope", "rope-below-bound", "rope-above-bound")
AD_HOC = "plan:local:4"  # an ad hoc plan, run as a scheme


def _cfg(encoding="rope", n_layer=4, max_len=16, **kw) -> GPTConfig:
    return GPTConfig(encoding=encoding, n_layer=n_layer, n_head=2, d_model=16, max_len=max_len, **kw)


def test_a_plan_names_one_kind_per_layer_repeats_a_pattern_and_fills_every_nth():
    assert parse_plan("rope,rope,rope,nope", 4, "rope") == [("rope", {})] * 3 + [("nope", {})]
    assert parse_plan("local:8*2,rope:base=1e6", 6, "rope") == (
        [("local", {"window": 8}), ("local", {"window": 8}), ("rope", {"base": 1e6})] * 2
    )
    assert parse_plan("every:4=nope:scale=log", 8, "rope") == [
        ("nope", {"scale": "log"}) if i in (3, 7) else ("rope", {}) for i in range(8)
    ]
    assert parse_plan("local:window=3:base=500", 1, "rope") == [("local", {"window": 3, "base": 500.0})]


@pytest.mark.parametrize(
    "plan, match",
    [
        ("rope,nope,rope", "names 3 layers for a model of n_layer=4"),
        ("rope,ropee", "encoding='ropee' is not known"),
        ("local:width=3", "kind 'local' takes no option 'width=3'; allowed: window, base"),
        ("local:x", "local's window='x' is not an int"),
        ("nope:scale=linear", "nope scale='linear'"),
        ("learned", "'learned' cannot be one layer's kind: it adds positions to the input"),
        ("rope-sinks", "'rope-sinks' cannot be one layer's kind: it holds parameters per layer"),
        ("rope*0", "COUNT >= 1"),
        ("", "must be a plan"),
    ],
)
def test_a_bad_plan_is_refused_naming_what_is_wrong(plan, match):
    with pytest.raises(LabError, match=match):
        _cfg(layers=plan)


def test_a_named_scheme_takes_no_second_plan_and_the_encoding_must_be_a_kind():
    with pytest.raises(LabError, match="has a per-layer plan of its own"):
        _cfg("swan", layers="rope")
    with pytest.raises(LabError, match="'fox' cannot be one layer's kind"):
        _cfg("fox", layers="rope")  # its gates would be dropped without a word


@pytest.mark.parametrize(
    "scheme, plan",
    [("plan:rope/nope", "rope,nope"), ("plan:every:2=nope", "every:2=nope"), ("plan:local:3*2", "local:3")],
)
def test_an_ad_hoc_plan_scheme_is_the_model_its_plan_on_rope_gives(scheme, plan):
    torch.manual_seed(0)
    ad_hoc = GPT(_cfg(scheme, 2))
    torch.manual_seed(0)
    given = GPT(_cfg("rope", 2, layers=plan))
    assert [lay.kind for lay in ad_hoc.encoding.layers] == [lay.kind for lay in given.encoding.layers]
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ad_hoc(x), given(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "scheme, match",
    [
        (
            "plan:rope/nope/rope",
            "schemes item 'plan:rope/nope/rope': .* names 3 layers for a model of n_layer=4",
        ),
        ("plan:ropee", "schemes item 'plan:ropee': encoding='ropee' is not known"),
        ("plan:", "schemes item 'plan:': .* must be a plan"),
        ("plan:swan", "'swan' cannot be one layer's kind"),
    ],
)
def test_a_bad_ad_hoc_plan_is_refused_naming_the_schemes_item(scheme, match):
    with pytest.raises(LabError, match=match):
        GPT(_cfg(scheme))


def _plan(encoding: str, n_layer: int, max_len: int = 16) -> list[str]:
    layers = GPT(_cfg(encoding, n_layer, max_len)).encoding.layers
    return [layer.kind for layer in layers]


def test_the_named_schemes_plans_follow_their_papers_at_the_labs_depth():
    assert _plan("swan", 8) == ["local:window=4:base=10000.0"] * 3 + ["nope:scale=log"] + (
        ["local:window=4:base=10000.0"] * 3 + ["nope:scale=log"]
    )
    assert _plan("swan", 2) == ["local:window=4:base=10000.0", "nope:scale=log"]  # one global layer kept
    gemma = _plan("gemma-local-global", 12)
    assert [i for i, k in enumerate(gemma) if k.startswith("rope")] == [5, 11]
    assert set(gemma) == {"local:window=4:base=10000.0", "rope:base=1000000.0:frac=1.0"}
    assert _plan("gemma-local-global", 4)[-1] == "rope:base=1000000.0:frac=1.0"
    assert [k.split(":")[0] for k in _plan("smollm3", 8)] == ["rope"] * 3 + ["nope"] + ["rope"] * 3 + ["nope"]
    assert _plan("p-rope", 1) == ["rope:base=10000.0:frac=0.25"]  # a tenth of 8 dimensions: one pair


@pytest.mark.parametrize("max_len", [16, 64, 4096])
def test_the_bound_schemes_sit_at_half_and_twice_men_et_als_bound(max_len):
    bound = 0.0424 * max_len**1.628  # Men et al. 2024, arxiv.org/abs/2405.14591
    for name, factor in (("rope-below-bound", 0.5), ("rope-above-bound", 2.0)):
        rotary = GPT(_cfg(name, 1, max_len)).encoding.layers[0].encoding.rotary
        assert rotary.base == pytest.approx(bound * factor, rel=1e-12)
    with pytest.raises(LabError, match="max_len=8 has base 0.626 <= 1"):
        GPT(_cfg("rope-below-bound", max_len=8))


def _attends(model: GPT, T: int) -> list[dict]:
    return list(_per_layer(model, T, 0, None, torch.device("cpu")))


def _qkv(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, T, 8, dtype=torch.float64, generator=g) for _ in range(3)]


def _window_by_loops(T: int, window: int) -> np.ndarray:
    return np.array([[i - window < j <= i for j in range(T)] for i in range(T)])


@pytest.mark.parametrize("T", [5, 16, 40])
def test_a_nope_layer_has_no_position_term_and_a_local_layer_masks_past_its_window(T):
    import posenc

    model = GPT(_cfg(layers="local:3:base=500,nope,nope:scale=log,rope:frac=0.5"))
    q, k, v = _qkv(T)
    local, nope, scaled, partial = _attends(model, T)
    pos = np.arange(T)

    def ours(attend, qq=q):
        attend = dict(attend)
        factor = attend.pop("query_scale", None)
        qq = qq if factor is None else qq * factor[..., None].double()
        return posenc.attention(qq, k, v, causal=True, **attend).numpy()

    # NoPE: plain causal attention of the unrotated q and k, nothing else
    np.testing.assert_allclose(ours(nope), reference.attention(q, k, v, causal=True), atol=1e-10)
    # local: RoPE at its base, and -inf beyond the window
    mask = np.where(_window_by_loops(T, 3), 0.0, -np.inf)
    rq, rk = reference.rope(q.numpy(), pos, base=500.0), reference.rope(k.numpy(), pos, base=500.0)
    np.testing.assert_allclose(
        ours(local), reference.attention(rq, rk, v, bias=mask, causal=True), atol=1e-10
    )
    # partial RoPE: the first half of each head's dimensions rotated, the rest not
    pq, pk = (reference.rope(x.numpy(), pos, rotary_dim=4) for x in (q, k))
    np.testing.assert_allclose(ours(partial), reference.attention(pq, pk, v, causal=True), atol=1e-10)
    # the log-length scale: 1 inside L = 16, log(n) / log(16) for a row that sees n > 16 keys
    n = np.arange(1, T + 1)
    s = np.maximum(np.log(n) / math.log(16), 1.0)[:, None]
    want = reference.attention(q.numpy() * s, k, v, causal=True)
    np.testing.assert_allclose(ours(scaled), want, atol=1e-6)  # the scale is float32, as the model's


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(0, 20), st.integers(1, 12))
def test_the_sliding_mask_is_the_last_window_keys_of_each_query(q_len, past, window):
    k_len = q_len + past
    got = sliding_causal_mask(q_len, k_len, window).numpy()
    for a in range(q_len):
        i = past + a  # the queries are the last q_len of the k_len positions
        assert [bool(x) for x in got[a]] == [i - window < j <= i for j in range(k_len)]


def test_a_nope_layer_does_not_see_the_order_of_the_earlier_tokens():
    torch.manual_seed(0)
    model = GPT(_cfg(n_layer=1, layers="nope")).double().eval()
    x = torch.randint(0, 256, (1, 12))
    shuffled = torch.cat((x[:, torch.randperm(11)], x[:, 11:]), dim=1)
    with torch.no_grad():  # one NoPE layer: the last token's output is a function of the set before it
        torch.testing.assert_close(model(x)[:, -1], model(shuffled)[:, -1], rtol=0, atol=1e-10)
    rope = GPT(_cfg(n_layer=1)).double().eval()
    with torch.no_grad():
        assert not torch.allclose(rope(x)[:, -1], rope(shuffled)[:, -1], atol=1e-6)


def test_a_cached_decode_of_a_plan_matches_the_full_forward():
    torch.manual_seed(1)
    model = GPT(_cfg("swan", n_layer=4)).eval()
    prompt = torch.randint(0, 256, (1, 10))
    full = model.generate(prompt, 30, temperature=0, use_cache=False)
    torch.testing.assert_close(model.generate(prompt, 30, temperature=0, use_cache=True), full)


def test_drope_continues_rope_without_its_rotations():
    rope = _cfg(n_layer=2)
    for name, plan in (("drope", ["nope", "nope"]), ("drope-scaled", ["nope:scale=log"] * 2)):
        model = GPT(RECIPES[name].adapt(rope, 4))
        assert [layer.kind for layer in model.encoding.layers] == plan
        assert all(a["rotary"] is None for a in _attends(model, 20))
        assert model.state_dict().keys() == GPT(rope).state_dict().keys()  # the RoPE weights load as they are
    assert not RECIPES["drope"].at_target  # recalibrated at the training length, as the paper


def test_every_named_scheme_trains_evaluates_past_l_and_records_its_plan(corpus_dir, tmp_path):
    out = tmp_path / "out"
    argv = ["compare", "--preset", "tiny", "--out", str(out), "--corpus", str(corpus_dir), "--cache-dir",
            str(tmp_path / "cache"), "--jobs", "1", "--no-progress", "--extend-steps", "2", "--recipes",
            "drope,drope-scaled,yarn", "--schemes", ",".join(("rope", *NAMED, AD_HOC))]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["scheme"]: r for r in results["results"]}
    assert {*NAMED, "rope~drope", "rope~drope-scaled", "rope~yarn"} <= set(rows)
    assert all(math.isfinite(v) for n in NAMED for v in rows[n]["ppl"].values())
    assert set(rows["swan"]["ppl"]) == {"16", "32", "64"}  # evaluated at 1, 2 and 4 L
    plans = results["provenance"]["layers"]
    assert plans["swan"] == ["nope:scale=log"] and plans["rope~drope"] == ["nope"]
    assert "rope" not in plans  # one kind in every layer: no plan to record
    run = json.loads((out / "models" / "p-rope" / "seed-0" / "run.json").read_text())
    assert run["layers"] == ["rope:base=10000.0:frac=0.25"]
    assert plans[AD_HOC] == ["local:window=4:base=10000.0"]


def test_train_takes_a_plan_on_the_command_line(corpus_dir, tmp_path):
    argv = ["train", "--encoding", "rope", "--layers", "rope,nope", "--n-layer", "2", "--n-head", "2",
            "--d-model", "16", "--train-len", "16", "--steps", "2", "--batch-size", "2", "--warmup", "1",
            "--out", str(tmp_path / "run"), "--corpus", str(corpus_dir), "--cache-dir", str(tmp_path / "c"),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["layers"] == ["rope:base=10000.0:frac=1.0", "nope"] and run["model"]["layers"] == "rope,nope"
    bad = [a if a != "rope,nope" else "rope,ropee" for a in argv]
    assert main(bad) == 2 and not (tmp_path / "run" / "ckpt-bad").exists()
