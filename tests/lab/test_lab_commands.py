"""posenc train / eval / sample / compare on the command line: a round trip, and errors as one line."""

import argparse
import json

import numpy as np
import pytest
import torch

from posenc.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--encoding", "rope", "--out", "{tmp}/r", "--corpus", "{tmp}/nope"], "does not exist"),
        (["compare", "--out", "{tmp}/c", "--schemes", "rope,ropee", "--preset", "tiny"], "unknown ['ropee']"),
        (["eval", "{tmp}/empty"], "no checkpoint at"),
        (["sample", "{tmp}/empty"], "no checkpoint at"),
        (
            ["train", "--encoding", "rope", "--out", "{tmp}/r", "--d-model", "30"],
            "d_model=30 must be a multiple",
        ),
        (["compare", "--out", "{tmp}/c", "--device", "tpu:0", "--preset", "tiny"], "device='tpu:0'"),
        (
            ["train", "--encoding", "rope", "--out", "{tmp}/r", "--device", "cuda:0"]
            if not torch.cuda.is_available()
            else ["train", "--encoding", "rope", "--out", "{tmp}/r", "--device", "cuda:999"],
            "cuda",
        ),
        # paths that cannot be written: refused before any work, naming the flag
        (["train", "--encoding", "rope", "--out", "{tmp}/afile"], "--out '{tmp}/afile' is an existing file"),
        (["train", "--encoding", "rope", "--out", "{tmp}/afile/run"], "'{tmp}/afile' is a file, not a dir"),
        (["compare", "--out", "{tmp}/afile", "--preset", "tiny"], "--out '{tmp}/afile' is an existing file"),
        (["compare", "--out", "{tmp}/afile/c", "--preset", "tiny"], "--out: cannot create"),
        (["train", "--encoding", "rope", "--out", "{tmp}/r", "--cache-dir", "{tmp}/afile"], "--cache-dir '"),
        (["compare", "--out", "{tmp}/c", "--cache-dir", "{tmp}/afile"], "--cache-dir '{tmp}/afile' is an"),
        (["eval", "{tmp}/empty", "--cache-dir", "{tmp}/afile"], "--cache-dir '{tmp}/afile' is an"),
        (["eval", "{tmp}/empty", "--json", "{tmp}/empty"], "--json '{tmp}/empty' is a directory"),
        (["eval", "{tmp}/empty", "--json", "{tmp}/afile/r.json"], "--json: cannot create '{tmp}/afile'"),
        (["sample", "{tmp}/empty", "--temperature", "nan"], "temperature=nan must be a finite number >= 0"),
        (["sample", "{tmp}/empty", "--temperature", "inf"], "temperature=inf must be a finite number >= 0"),
        # a binary file is refused like a folder of binary files
        (["train", "--encoding", "rope", "--out", "{tmp}/r", "--corpus", "{tmp}/binary.dat"], "binary file"),
        (["train", "--encoding", "rope", "--out", "{tmp}/r", "--grad-clip", "-1"], "grad_clip=-1.0 must be"),
        (
            ["compare", "--out", "{tmp}/c", "--protocol", "windows,chunks"],
            "unknown ['chunks']; allowed: windows",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--copy-fraction", "1.5"],
            "copy_fraction=1.5 must be a number in [0, 1]",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--copy-fraction", "nan"],
            "copy_fraction=nan must be a number in [0, 1]",
        ),
        (
            ["train", "--encoding", "rope", "--out", "{tmp}/r", "--copy-fraction", "-0.1"],
            "copy_fraction=-0.1 must",
        ),
        (
            [
                "train",
                "--encoding",
                "rope",
                "--out",
                "{tmp}/r",
                "--copy-fraction",
                "0.5",
                "--passkey-fraction",
                "0.6",
            ],
            "copy_fraction=0.5 and passkey_fraction=0.6 add up to 1.1",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--passkey-fraction", "0.5"],
            "passkey_fraction=0.5 needs train_len >= 35 (a passkey prompt and its answer in one training "
            "window); train_len is 16",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--mix", "recall=0.7,copy=0.5"],
            "mix='recall=0.7,copy=0.5': the shares add up to 1.2; they must add up to at most 1",
        ),
        (
            ["train", "--encoding", "rope", "--out", "{tmp}/r", "--mix", "needle=0.1"],
            "mix='needle=0.1': unknown task 'needle'; allowed: recall, copy, passkey",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--mix", "passkey=0.1"],
            "mix='passkey=0.1' needs train_len >= 35",
        ),
        # recipes that would run nothing, or be silently ignored
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--recipes", "pi"],
            "--recipes pi needs --extend-steps K > 0",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--extend-to", "4"],
            "--extend-to 4 needs --extend-steps K > 0",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--extend-steps", "2", "--schemes", "alibi"],
            "recipes ['pi', 'yarn', 'abf', 'pose', 'drope', 'drope-scaled', 'none'] apply to none of "
            "schemes=['alibi']",
        ),
        (
            ["compare", "--out", "{tmp}/c", "--preset", "tiny", "--extend-steps", "2", "--recipes", "pi"]
            + ["--schemes", "alibi,none"],
            "recipes ['pi'] apply to none of schemes=['alibi', 'none']",
        ),
        (["eval", "{tmp}/afile"], "CKPT: no checkpoint at '{tmp}/afile'"),
        (["eval", "{tmp}/empty", "--corpus", "{tmp}/nope"], "--corpus: corpus '{tmp}/nope' does not exist"),
    ],
)
def test_cli_errors_are_one_line_and_nonzero(argv, message, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "binary.dat").write_bytes(bytes(range(256)) * 64)  # NUL bytes: not text
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message.replace("{tmp}", str(tmp_path)) in err
    assert err.startswith(f"posenc {argv[0]}: error: ") and len(err.splitlines()) == 1


def test_cli_rejects_unknown_encoding_and_bad_lengths(capsys):
    assert main(["train", "--encoding", "ropee", "--out", "x"]) == 2
    assert "encoding='ropee' is not known" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "x", "--lens", "64,-1"])
    assert "expected positive integers" in capsys.readouterr().err


def test_cli_train_eval_sample_round_trip(corpus_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--corpus", str(corpus_dir), "--cache-dir", str(tmp_path / "cache")]
    assert (
        main(
            [
                "train",
                "--encoding",
                "learned",
                "--out",
                str(run),
                "--train-len",
                "16",
                "--n-layer",
                "1",
                "--n-head",
                "2",
                "--d-model",
                "16",
                "--steps",
                "3",
                "--batch-size",
                "2",
                "--no-progress",
                *base,
            ]
        )
        == 0
    )
    assert "trained learned to step 3" in capsys.readouterr().out
    report = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                str(run),
                "--lens",
                "16,32",
                "--eval-tokens",
                "64",
                "--passkey-lens",
                "120",
                "--passkey-trials",
                "1",
                "--json",
                str(report),
                *base,
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "| learned |" in text and "n/a" in text
    data = json.loads(report.read_text())
    assert data["results"][0]["ppl"]["32"] is None and data["passkey"]["plain"]["120"] is None
    assert main(["sample", str(run), "--prompt", "def ", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("def ")


def test_cli_compare_seeds_must_be_a_positive_integer(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--seeds", "0"])
    assert "--seeds: expected a positive integer, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        # "," is an empty list, not "everything"; a name twice would be two identical rows
        (["compare", "--schemes", ","], "argument --schemes: expected one or more comma-separated names"),
        (["compare", "--recipes", ",", "--extend-steps", "2"], "argument --recipes: expected one or more"),
        (
            ["compare", "--recipes", "pi,yarn,pi", "--extend-steps", "2"],
            "--recipes: 'pi' given more than once",
        ),
        (["compare", "--schemes", "rope,alibi,rope"], "argument --schemes: 'rope' given more than once"),
        (["compare", "--protocol", "past,past"], "argument --protocol: 'past' given more than once"),
        (["compare", "--eval-mults", "1,2,2"], "argument --eval-mults: '2' given more than once"),
        (["compare", "--eval-mults", "2,02"], "argument --eval-mults: '2,02' gives a value more than once"),
        (["eval", "x", "--lens", ","], "argument --lens: expected one or more comma-separated positive"),
        (["eval", "x", "--extensions", "pi,pi"], "argument --extensions: 'pi' given more than once"),
        (["eval", "x", "--passkey-lens", "64,64"], "argument --passkey-lens: '64' given more than once"),
        (
            ["compare", "--passkey-trials", "-2"],
            "argument --passkey-trials: expected an integer >= 0, got '-2'",
        ),
        (["compare", "--steps", str(2**63)], f"argument --steps: expected a positive integer, got '{2**63}'"),
        (["compare", "--seed", str(2**63)], "argument --seed: expected an integer seed, got"),
        (["train", "--encoding", "rope", "--out", "x", "--threads", str(10**6)], "argument --threads"),
    ],
)
def test_cli_lists_and_integers_are_refused_when_parsed(argv, message, capsys):
    """Refused by argparse, naming the option, before the handler runs: nothing is created or started."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_the_largest_seeds_reach_torch_intact():
    """Any int64 seed, and the seeds a comparison derives from it, seed the training and the batch order:
    torch reads a seed modulo 2**64, so the reduction keeps every seed it already took."""
    from posenc.lab.data import batch_at

    tokens = np.arange(1000, dtype=np.uint16)
    for seed in (2**63 - 1, -(2**63), 2**63 + 5):  # the last: --seed 2**63 - 1 with --seeds 7
        x, y, _ = batch_at(tokens, 3, batch_size=2, seq_len=8, seed=seed)  # an OverflowError in torch before
        assert x.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])
    for seed in (-7, 0, 12345):  # the seeds torch took unreduced draw what they drew before
        unreduced = torch.Generator().manual_seed((seed * 1_000_003 + 3) * 4099).get_state()
        reduced = torch.Generator().manual_seed((seed * 1_000_003 + 3) * 4099 % 2**64).get_state()
        assert torch.equal(unreduced, reduced)


def test_cli_integer_flags_say_what_they_expect(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--encoding", "rope", "--out", "x", "--steps", "0"])
    assert "argument --steps: expected a positive integer, got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--jobs", "two"])
    assert "argument --jobs: expected a positive integer, got 'two'" in capsys.readouterr().err


def test_cli_eval_refuses_an_unknown_extension(corpus_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--corpus", str(corpus_dir), "--cache-dir", str(tmp_path / "cache")]
    tiny = ["--train-len", "16", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--batch-size", "2"]
    assert (
        main(
            ["train", "--encoding", "rope", "--out", str(run), *tiny, "--steps", "1", "--no-progress", *base]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(["eval", str(run), "--lens", "16", "--eval-tokens", "32", "--extensions", "pi,rerope", *base])
        == 2
    )
    assert (
        "extensions=['pi', 'rerope']: unknown ['rerope']; allowed: pi, ntk, dynamic, yarn"
        in capsys.readouterr().err
    )


TINY = ["--train-len", "16", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--batch-size", "2"]


def test_cli_grad_clip_error_blames_grad_clip_alone(capsys):
    assert main(["train", "--encoding", "rope", "--out", "x", "--grad-clip", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "posenc train: error: grad_clip=-1.0 must be a number >= 0 (0 turns clipping off)"


def test_cli_even_sizes_are_asked_of_the_encoding_that_needs_them(capsys):
    argv = ["train", "--out", "x", "--no-progress"]
    assert main([*argv, "--encoding", "sinusoidal", "--d-model", "15", "--n-head", "3"]) == 2
    err = capsys.readouterr().err
    assert "encoding='sinusoidal' needs an even d_model, got 15" in err and "RoPE" not in err
    assert main([*argv, "--encoding", "rope", "--d-model", "30", "--n-head", "2"]) == 2
    assert "encoding='rope' needs an even head size: d_model=30 / n_head=2 = 15" in capsys.readouterr().err


@pytest.mark.parametrize("encoding", ["sinusoidal", "alibi", "learned", "none"])
def test_odd_head_sizes_train_where_nothing_pairs_head_dimensions(encoding, corpus, tmp_path):
    from posenc.lab.config import GPTConfig, TrainConfig
    from posenc.lab.train import train

    cfg = GPTConfig(encoding=encoding, n_layer=1, n_head=2, d_model=30, max_len=16)
    assert cfg.head_dim == 15
    r = train(cfg, TrainConfig(steps=2, batch_size=2), tmp_path / "r", corpus=corpus, progress=False)
    assert r.step == 2 and r.model.generate(torch.zeros(1, 1, dtype=torch.long), 3).shape == (1, 4)


@pytest.mark.parametrize("style, digits", [("code", 3), ("sentences", 5), ("code", 1)])
def test_cli_passkey_minimum_is_the_shortest_length_that_works(style, digits, tmp_path, capsys):
    import re

    from posenc.lab.passkey import passkey_prompt

    (tmp_path / "empty").mkdir()
    argv = ["eval", str(tmp_path / "empty"), "--passkey-lens", "16,400", "--passkey-style", style]
    assert main(argv + ["--passkey-digits", str(digits)]) == 2
    err = capsys.readouterr().err
    assert "passkey lengths [16] are too short" in err and len(err.splitlines()) == 1
    least = int(re.search(r"at least (\d+) bytes", err).group(1))
    key = "7" * digits  # the prompt holds least - digits bytes, the model answers with the key's digits
    ids, _ = passkey_prompt(least - digits, key, 0.5, style=style)
    assert len(ids) == least - digits
    with pytest.raises(ValueError, match="too short"):
        passkey_prompt(least - digits - 1, key, 0.5, style=style)


def test_cli_resume_without_a_checkpoint_says_it_starts_a_new_run(corpus_dir, tmp_path, capsys):
    base = ["--corpus", str(corpus_dir), "--cache-dir", str(tmp_path / "cache"), "--no-progress", *TINY]
    (tmp_path / "empty").mkdir()
    for run in (tmp_path / "empty", tmp_path / "missing"):
        assert (
            main(["train", "--encoding", "rope", "--out", str(run), "--steps", "1", "--resume", *base]) == 0
        )
        captured = capsys.readouterr()
        assert (
            f"posenc train: --resume: no checkpoint in {str(run)!r} yet; starting a new run" in captured.err
        )
        assert "trained rope to step 1" in captured.out
    assert main(["train", "--encoding", "rope", "--out", str(run), "--steps", "2", "--resume", *base]) == 2
    assert "different configuration" in capsys.readouterr().err  # steps differ: a real resume was tried


def _subparser(name):
    from posenc.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["train", "compare"])
def test_cli_help_gives_every_option_a_meaning_and_its_default(command, capsys):
    parser = _subparser(command)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    # argparse wraps lines, at spaces and after hyphens ("rope-" / "random"): compare without whitespace
    shown = "".join(capsys.readouterr().out.split())
    for action in parser._actions:
        if not action.option_strings or action.option_strings[-1] == "--help":
            continue
        flag = action.option_strings[-1]
        assert action.help, flag
        text = " ".join(parser._get_formatter()._expand_help(action).split())
        assert "".join(text.split()) in shown, flag
        if action.default is not None and action.default is not False:
            assert f"(default: {action.default})" in text, flag
        elif not (action.required or isinstance(action, argparse._StoreTrueAction)):
            assert "(default: " in text, flag  # None: the help says what happens instead


def test_cli_train_defaults_to_eight_heads_and_compile_off():
    args = _subparser("train").parse_args(["--encoding", "alibi", "--out", "x"])
    assert args.n_head == 8 and args.compile is False


def test_cli_compile_flag_reaches_training(monkeypatch, tmp_path):
    import posenc.lab.compare as lab_compare
    import posenc.lab.train as lab_train

    seen = {}

    def fake_train(*args, **kwargs):
        seen["train"] = kwargs["compile"]
        raise ValueError("stop here")

    def fake_compare(*args, **kwargs):
        seen["compare"] = kwargs["compile"]
        raise ValueError("stop here")

    monkeypatch.setattr(lab_train, "train", fake_train)
    monkeypatch.setattr(lab_compare, "run_compare", fake_compare)
    assert main(["train", "--encoding", "rope", "--out", str(tmp_path / "r"), "--compile"]) == 2
    assert main(["compare", "--out", str(tmp_path / "c"), "--preset", "tiny", "--compile"]) == 2
    assert seen == {"train": True, "compare": True}


def test_every_option_of_every_command_has_help_and_shows_its_default():
    """`posenc COMMAND --help` lists every option with its default (the README says so); eval and sample
    did not."""
    import argparse

    from posenc.cli import HelpFormatter, build_parser

    parser = build_parser()
    for action in parser._subparsers._group_actions:
        for name, sub in action.choices.items():
            text = sub.format_help()
            for a in sub._actions:
                if not a.option_strings or a.dest == "help":
                    continue
                assert a.help, f"posenc {name} {a.option_strings[0]} has no help"
                if a.default not in (None, False, argparse.SUPPRESS):
                    shown = sub.formatter_class is HelpFormatter or "default" in a.help
                    assert shown, f"posenc {name} {a.option_strings[0]} does not show its default"
            assert "show this help message" in text
