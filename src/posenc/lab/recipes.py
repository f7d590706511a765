"""Context extension by training: each recipe continues a model trained at L for K more steps so that it
works at a target length T = factor x L, with the same number of steps and tokens as every other recipe.

A recipe changes the model's config (its RoPE) and says at which length its windows are: at T with
``batch x L / T`` sequences per step, or at L with the whole batch, so that every step sees ``batch x L``
tokens whatever the recipe (compute-matched; attention's share grows with T, a few percent at this size).

- ``pi``: position interpolation, positions divided by the factor, fine-tuned at T (Chen et al. 2023,
  arxiv.org/abs/2306.15595: without fine-tuning PI is poor; 1000 steps at 8K bring LLaMA-7B to 6.9 ppl).
- ``yarn``: YaRN's frequencies and attention temperature, fine-tuned at T (Peng et al. 2023,
  arxiv.org/abs/2309.00071: reported to need ~10x fewer tokens than PI).
- ``abf``: adjusted base frequency, the base raised as NTK-aware scaling does (base x f^(d/(d-2))),
  fine-tuned at T (Code Llama, Roziere et al. 2023; Xiong et al. 2023, arxiv.org/abs/2309.16039, who
  raise it further, 50-100x).
- ``pose``: PoSE, positional skip-wise training: windows of L whose position ids skip so that they cover
  0 .. T-1, with PI at the factor (Zhu et al. 2023, arxiv.org/abs/2309.10400, PoSE-Linear): T's positions at
  L's cost.
- ``drope``: DroPE, RoPE dropped from every layer and the model recalibrated at L (Gelberg et al. 2026,
  arxiv.org/abs/2512.12167: after pretraining, under 1% of its budget brings NoPE's extrapolation without
  long-context fine-tuning); ``drope-scaled`` the same with the log-length query scale
  (:func:`posenc.lab.layered.log_length_scale`) on every layer, the attention temperature past L.
- ``none``: the control: K more steps at L, nothing changed.

This module imports nothing of the laboratory but its checks and errors; the schedules are the eval-time
extensions' (:func:`posenc.extension.extension_scaling`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from posenc.extension import extension_scaling
from posenc.lab.checks import check_choices, check_int
from posenc.lab.errors import LabError

__all__ = ["RECIPES", "Recipe", "check_recipes", "continued", "pose_positions"]


@dataclass(frozen=True)
class Recipe:
    """One way to extend a trained model by training.

    name: what ``--recipes`` calls it; the row is ``<scheme>~<name>``.
    method: the RoPE schedule it trains with, a short name of
        :func:`posenc.extension.extension_scaling` ("pi", "yarn", "ntk"), or None (unchanged).
    at_target: it trains on windows of the target length (else of the training length).
    pose: its windows' position ids skip so that they cover the target length (PoSE).
    layers: the per-layer plan the continued model attends with (:mod:`posenc.lab.layers`; DroPE's
        ``"nope"``), or None: the model's own.
    meaning: one line for the report.
    """

    name: str
    method: str | None
    at_target: bool
    meaning: str
    pose: bool = False
    layers: str | None = None

    def adapt(self, cfg, factor: int):
        """The config of the continued model: ``cfg`` with the recipe's RoPE schedule at ``factor`` (the
        scaling dict eval-time extension uses, ``original_max_position_embeddings`` the training length)
        and, for PoSE, its target length; for DroPE, its plan of layers without RoPE."""
        scaling = None if self.method is None else extension_scaling(self.method, float(factor), cfg.max_len)
        pose_len = factor * cfg.max_len if self.pose else None
        layers = self.layers if self.layers is not None else getattr(cfg, "layers", None)
        return replace(cfg, rope_scaling=scaling, pose_len=pose_len, layers=layers)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("pi", "pi", True, "position interpolation, fine-tuned at the target length"),
        Recipe("yarn", "yarn", True, "YaRN, fine-tuned at the target length"),
        # the NTK-aware base (base x f^(d/(d-2))) is the base change; fine-tuned, it is ABF
        Recipe("abf", "ntk", True, "the base raised (NTK-aware), fine-tuned at the target length"),
        Recipe(
            "pose",
            "pi",
            False,
            "PoSE: trained at the training length with position ids skipping over the target length, PI",
            pose=True,
        ),
        Recipe(
            "drope",
            None,
            False,
            "DroPE: RoPE dropped from every layer, recalibrated at the training length",
            layers="nope",
        ),
        Recipe(
            "drope-scaled",
            None,
            False,
            "DroPE with the log-length query scale in every layer, recalibrated at the training length",
            layers="nope:scale=log",
        ),
        Recipe("none", None, False, "the control: trained on at the training length, unchanged"),
    )
}


def check_recipes(recipes, factor: int, steps: int, batch_size: int) -> tuple[str, ...]:
    """The recipes of a comparison, checked whether or not any runs: known names, each once, steps >= 0
    (0: none run), an integer factor >= 2; when they run, the factor must divide the batch (the sequences
    per step at the target length)."""
    recipes = check_choices("recipes", recipes, RECIPES, empty_ok=True)
    twice = sorted({r for r in recipes if recipes.count(r) > 1})
    if twice:  # each would train and report the same model twice
        raise LabError(f"recipes={list(recipes)!r} names {twice} more than once; give each recipe once")
    check_int("extend_steps", steps, minimum=0)
    check_int("extend_to", factor, minimum=2)
    if steps and recipes and batch_size % factor:
        raise LabError(
            f"extend_to={factor} must divide batch_size={batch_size}: recipes at the target length train on "
            f"batch_size / extend_to sequences per step, so that every recipe sees the same tokens"
        )
    return recipes


def pose_positions(target: int, batch: int, length: int, device=None, generator=None) -> torch.Tensor:
    """PoSE's position ids for ``batch`` training windows of ``length`` tokens covering 0 .. target-1,
    ``(batch, length)`` int64 (Zhu et al. 2023, their two-chunk form): each window splits at a uniform
    point in 1 .. ceil(length / 2); the first chunk starts at a uniform skip ``a`` in 0 .. target - length,
    the second continues after a further skip, its start shifted by a uniform ``b`` in a .. target - length.
    Drawn from ``generator`` (torch's global one by default, which a training run seeds)."""
    if target < length:
        raise LabError(f"PoSE covers {target} positions with windows of {length}: it needs target >= length")
    room = target - length

    def uniform(low: torch.Tensor, high) -> torch.Tensor:  # integers low .. high inclusive, per row
        u = torch.rand(batch, generator=generator, dtype=torch.float64)
        return low + (u * (high - low + 1)).long().clamp(max=high - low)

    zero = torch.zeros(batch, dtype=torch.long)
    split = uniform(zero + 1, (length + 1) // 2)
    first = uniform(zero, room)
    second = uniform(first, room)
    ids = torch.arange(length).expand(batch, length)
    shift = torch.where(ids < split[:, None], first[:, None], second[:, None])
    return (ids + shift).to(device)


def continued(model_cfg, train_cfg, recipe: str, factor: int, steps: int, base_run: str):
    """The model and training configs of ``recipe`` continuing the run ``base_run`` (trained with
    ``model_cfg`` and ``train_cfg``) for ``steps`` steps towards ``factor`` times its length: its weights
    to start from, the next batches of its data stream, the learning rate its schedule ended at (warmed up
    again over a tenth of the steps, at most the base run's warmup), and the window length and batch of
    the recipe (the same tokens per step for every recipe)."""
    spec = RECIPES[recipe]
    at_target = spec.at_target
    train = replace(
        train_cfg,
        steps=steps,
        lr=train_cfg.lr * train_cfg.min_lr_ratio,
        warmup=min(train_cfg.warmup, steps // 10),
        batch_size=train_cfg.batch_size // factor if at_target else train_cfg.batch_size,
        seq_len=factor * model_cfg.max_len if at_target else None,
        init_from=str(base_run),
        first_batch=train_cfg.steps,
    )
    return spec.adapt(model_cfg, factor), train
