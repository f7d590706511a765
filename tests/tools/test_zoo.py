"""Every model type transformers registers with a rotary module, built tiny and patched: exact or refused,
never silently wrong nor accepted and then crashed; and docs/models.md's table says what the sweep finds
(``posenc zoo --docs docs/models.md`` rewrites it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import posenc.hf
from posenc.tools import zoo

DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"
TYPES = zoo.rope_model_types()


def documented_rows() -> dict[str, str]:
    text = DOCS.read_text()
    table = text[text.index(zoo.BEGIN) : text.index(zoo.END)]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| ([^ |]+) \|.*\|$", table, re.M)}


@pytest.mark.parametrize("model_type", TYPES)
def test_each_rope_family_is_exact_or_refused(model_type):
    (result,) = zoo.sweep([model_type])
    assert not result.failed, f"{model_type}: {result}"
    row = documented_rows().get(model_type)
    found = zoo.table_row(result)
    assert row == found, (
        f"docs/models.md: {row!r}, the sweep: {found!r}; run posenc zoo --docs docs/models.md"
    )


def test_the_table_lists_exactly_the_model_types_with_a_rotary_module():
    rows = documented_rows()
    assert sorted(rows) == TYPES, "run posenc zoo --docs docs/models.md"
    assert {row.rsplit("|", 2)[-2].strip() for row in rows.values()} <= {"exact", "refused", ""}
    assert {row.split(" | ")[1] for row in rows.values()} <= {
        "exact",
        "exact, positions unseen",
        "refused",
        "no rotary module",
        "not built tiny",
        "does not run tiny",
    }


def test_a_wrong_schedule_is_caught_as_silently_wrong(monkeypatch):
    """The check can fail: posenc made to use another base for Llama is classified silently wrong."""
    real = posenc.hf.patch_model

    def wrong(model, rotary=None, **kwargs):
        config = model.config
        rot = posenc.RotaryEmbedding(
            config.head_dim, base=5000.0, layout="half", max_position_embeddings=4096
        )
        return real(model, rotary=rot, **kwargs)

    monkeypatch.setattr(posenc.hf, "patch_model", wrong)
    (result,) = zoo.sweep(["llama"])
    assert result.status == "silently wrong" and result.prefill > 100 * 1e-5 * result.scale


def test_a_crash_after_patching_is_caught(monkeypatch):
    real = posenc.hf.patch_model

    def breaking(model, **kwargs):
        real(model, **kwargs)
        for module in model.modules():
            if hasattr(module, "posenc_rotary"):
                module.posenc_rotary.cos_sin = lambda *a, **k: (torch.zeros(1), torch.zeros(1))
        return model

    monkeypatch.setattr(posenc.hf, "patch_model", breaking)
    (result,) = zoo.sweep(["qwen2"])
    assert result.status == "accepted then crashed"


def test_a_remap_posenc_cannot_reproduce_is_caught_when_the_replica_check_is_skipped(monkeypatch):
    """The remap column can fail: without patch_model(remap=)'s replica check, GLM (its rotary channels
    paired otherwise than posenc's remap rotates them) reads silently wrong; with it, it is refused."""
    from posenc.hf import patch

    (result,) = zoo.sweep(["glm"])
    assert result.status == "exact" and result.remap == "refused"
    monkeypatch.setattr(patch, "check_replica", lambda model, patch_fn: None)
    (result,) = zoo.sweep(["glm"])
    assert result.remap == "silently wrong"


def test_the_command_prints_each_family_and_the_counts(capsys):
    from posenc.cli import main

    assert main(["zoo", "--types", "llama,pixtral"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^llama +exact +prefill", out, re.M)
    assert re.search(r"^pixtral +does not run tiny", out, re.M)
    assert "2 model types with a rotary module" in out


def test_a_wrong_m_rope_layout_is_caught(monkeypatch):
    """With text alone every M-RoPE axis carries the same position; the sweep also runs three axes that
    differ, so Qwen3-VL's interleaved frequency slots read as contiguous sections are caught."""
    import dataclasses

    from posenc.hf import plan

    right = plan.READERS["qwen3_vl_text"]

    def flipped(config):
        return tuple(
            dataclasses.replace(lp, rope=dataclasses.replace(lp.rope, mrope_order="contiguous"))
            for lp in right(config)
        )

    monkeypatch.setitem(plan.READERS, "qwen3_vl_text", flipped)
    (result,) = zoo.sweep(["qwen3_vl_text"])
    assert result.status == "silently wrong"


def test_a_plan_posenc_cannot_run_is_refused_when_patched():
    """A plan whose M-RoPE sections do not fit its rotary dimension was accepted and raised at the first
    forward; it is refused by patch_model, naming the layer."""
    import dataclasses

    from posenc.hf import patch_model, position_plan

    model = zoo._model_class("qwen3_vl_text")(zoo.tiny_config("qwen3_vl_text"))
    bad = tuple(
        dataclasses.replace(lp, rope=dataclasses.replace(lp.rope, mrope_section=(40, 40, 40)))
        for lp in position_plan(model.config)
    )
    with pytest.raises(ValueError, match=r"plan layer 0: mrope_section \[40, 40, 40\] sums to 120"):
        patch_model(model, plan=bad)
    assert not any(hasattr(m, "posenc_rotary") for m in model.modules())


@pytest.mark.parametrize("scaling", sorted(zoo.scalings()))
@pytest.mark.parametrize(
    "model_type", ["llama", "qwen2", "olmo3", "gpt_neox", "gemma3_text", "qwen2_vl_text"]
)
def test_scaling_variants_are_exact_or_refused(model_type, scaling):
    """A sample of the families under each scaling method (posenc zoo --scaling runs them all)."""
    (result,) = zoo.sweep([model_type], scaling=zoo.scalings()[scaling])
    assert not result.failed, f"{model_type} with {scaling}: {result}"
    assert result.status in ("exact", "refused"), result
    if model_type == "llama":  # the methods moved the positions: a wrong schedule would have shown
        assert result.status == "exact" and result.remap == "exact"


def test_scaled_configs_carry_the_method_in_every_layer_type():
    config = zoo.scaled(zoo.tiny_config("gemma3_text"), zoo.scalings()["yarn"])
    for params in config.rope_parameters.values():
        assert params["rope_type"] == "yarn" and params["original_max_position_embeddings"] == 131072
    assert {p["rope_theta"] for p in config.rope_parameters.values()} == {1e4, 1e6}


def test_a_rotary_module_built_to_skip_the_scaling_stays_unscaled():
    """Molmo2 keeps a second rotary module that ignores rope_scaling (for the layers outside
    rope_scaling_layers): patched, each module keeps its own schedule, checked against its own cos/sin."""
    (result,) = zoo.sweep(["molmo2_text"], scaling=zoo.scalings()["linear"])
    assert result.status == "exact", result


@pytest.mark.parametrize(
    "args, message",
    [
        (["--docs", "missing.md"], r"--docs '.*missing.md' is not an existing file"),
        (["--docs", "plain.md"], r"--docs '.*plain.md' has no <!-- posenc zoo: begin -->"),
        (["--docs", "."], r"--docs '.*' is a directory"),
        (["--json", "."], r"--json '.*' is a directory"),
        (
            ["--types", "lama"],
            r"--types: 'lama' is not a model type transformers registers; did you mean llama,",
        ),
        (["--types", " , "], r"--types ' , ' names no model type"),
    ],
)
def test_the_command_refuses_bad_arguments_before_the_sweep(args, message, tmp_path, monkeypatch, capsys):
    """A bad --docs or --json path failed with a traceback after the whole sweep, and a misspelt type was
    swept as a type; each is one error line naming the option, exit status 2, before any work."""
    from posenc.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.md").write_text("# no table here\n")
    monkeypatch.setattr(zoo, "sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    assert main(["zoo", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.fullmatch(f"posenc zoo: error: {message}.*", err), err


def test_the_command_writes_json_into_a_new_folder(tmp_path, monkeypatch):
    from posenc.cli import main

    monkeypatch.setattr(zoo, "sweep", lambda types, progress=None: [zoo.ZooResult("llama", "refused", "x")])
    assert main(["zoo", "--types", "llama", "--json", str(tmp_path / "new" / "zoo.json"), "--quiet"]) == 0
    assert '"model_type": "llama"' in (tmp_path / "new" / "zoo.json").read_text()


def test_a_family_whose_rotary_is_an_option_is_checked_with_it_on():
    """ESM's rotary variant (position_embedding_type="rotary") read "no rotary module" from its default
    config, and patched, its forward raised (its rotary module's forward takes a layer_type it ignores and
    was taken for a per-layer-type one); the zoo builds it rotary, and it patches exactly."""
    assert zoo.tiny_config("esm").position_embedding_type == "rotary"
    (result,) = zoo.sweep(["esm"])
    assert result.status == "exact", result


def test_blt_is_built_tiny_and_patched_exactly():
    """BLT's hashed n-gram embeddings (500002 rows per n) kept it at 785M parameters after shrinking; built
    tiny, its four rotary modules (patcher, local encoder and decoder, global model) patch exactly, near
    position 3000 too."""
    (result,) = zoo.sweep(["blt"])
    assert result.status == "exact" and result.far is not None, result
