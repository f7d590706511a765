"""posenc.real.extend: what a run measures by default, and the settings it refuses before the model loads."""

import pytest
import torch

from posenc.real.extend import ExtendSettings, check_settings, resolve

CONFIG = {"model_type": "llama", "max_position_embeddings": 8192, "rope_theta": 1e5}


def test_defaults_are_the_trained_length_and_twice_it_on_the_cpu_and_four_times_on_cuda():
    cpu = resolve(ExtendSettings(), CONFIG, torch.device("cpu"))
    assert cpu.lengths == (8192, 16384) and cpu.factor == 2.0 and cpu.train_len == 8192
    assert (cpu.score_tokens, cpu.short_tokens, cpu.short_length) == (1024, 1024, 8192)
    cuda = resolve(ExtendSettings(), CONFIG, torch.device("cuda"))
    assert cuda.lengths == (8192, 16384, 32768) and cuda.factor == 4.0


def test_explicit_settings_win_and_every_length_scores_the_same_final_tokens():
    plan = resolve(ExtendSettings(lengths=(2048, 512, 2048), train_len=1024), CONFIG, torch.device("cpu"))
    assert plan.lengths == (512, 2048) and plan.factor == 2.0
    assert plan.score_tokens == 64  # an eighth of the shortest length, the same count at every length
    assert (plan.short_length, plan.short_tokens) == (512, 511)
    inside = resolve(ExtendSettings(lengths=(4096,), factor=3.0), CONFIG, torch.device("cpu"))
    assert inside.factor == 3.0 and inside.short_length == 4096
    beyond = resolve(ExtendSettings(lengths=(16384,)), CONFIG, torch.device("cpu"))
    assert beyond.short_length is None  # no window inside the trained length: no short-prompt cost


def test_the_cpu_budget_asks_rulers_single_needle_of_the_model_alone_up_to_n_with_answers_bounded():
    from posenc.real.budgets import CPU_TASKS, CPU_TRIALS
    from posenc.real.tasks import DEFAULT_TASKS, TASKS

    cpu = resolve(ExtendSettings(budget="cpu"), CONFIG, torch.device("cpu"))
    assert (cpu.tasks, cpu.questions, cpu.answer_tokens, cpu.answer_slack) == (CPU_TASKS, None, None, 16)
    assert cpu.trials == CPU_TRIALS and all(TASKS[t].max_questions == 1 for t in CPU_TASKS)
    n = cpu.train_len
    assert cpu.ladder == (n // 8, n // 4, n // 2) and cpu.baseline_within and cpu.lengths == (n, 2 * n)
    capped = resolve(ExtendSettings(budget="cpu", answer_tokens=40), CONFIG, torch.device("cpu"))
    assert (capped.answer_tokens, capped.answer_slack) == (40, None)  # the flag replaces the slack
    every = resolve(ExtendSettings(), CONFIG, torch.device("cpu"))
    assert every.tasks == DEFAULT_TASKS and every.answer_slack is None and every.ladder == ()
    assert not any(TASKS[t].variant_of for t in every.tasks)  # the many-needle variants only when named
    named = resolve(ExtendSettings(budget="cpu", ladder=(), methods=("yarn",)), CONFIG, torch.device("cpu"))
    assert named.ladder == ()  # no ladder without the model as trained, nor when asked for none


@pytest.mark.parametrize(
    "settings, message",
    [
        (ExtendSettings(methods=()), "--methods is empty"),
        (ExtendSettings(methods=("none", "none")), "--methods names a method twice"),
        (
            ExtendSettings(methods=("yarn", "rope")),
            "--methods rope: unknown method 'rope'; choose from none, pi",
        ),
        (ExtendSettings(lengths=(4,)), "--lengths must be an integer >= 16, got 4"),
        (ExtendSettings(lengths=(64.5,)), "--lengths must be an integer >= 16, got 64.5"),
        (ExtendSettings(ladder=(8,)), "--ladder must be an integer >= 16, got 8"),
        (ExtendSettings(windows=0), "--windows must be an integer >= 1, got 0"),
        (ExtendSettings(passkey_trials=-1), "--passkey-trials must be an integer >= 0, got -1"),
        (ExtendSettings(train_len=0), "--train-len must be an integer >= 1, got 0"),
        (ExtendSettings(factor=float("inf")), "--factor must be a finite number >= 1, got inf"),
        (ExtendSettings(factor=0.5), "--factor must be a finite number >= 1, got 0.5"),
    ],
)
def test_bad_settings_are_refused_naming_the_flag(settings, message):
    with pytest.raises(ValueError) as info:
        check_settings(settings)
    assert message in str(info.value)


def test_questions_past_what_the_shortest_length_holds_are_refused_before_any_text_is_built():
    settings = ExtendSettings(lengths=(2048, 4096), train_len=2048, questions=1_000_000_000)
    with pytest.raises(ValueError, match="--questions 1000000000: a haystack of 2048 tokens"):
        resolve(settings, CONFIG, torch.device("cpu"))
