"""posenc train / eval / sample / compare on the command line: a round trip, and errors as one line."""

import json

import pytest
import torch

from posenc.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--encoding", "rope", "--out", "{tmp}/r", "--corpus", "{tmp}/nope"], "does not exist"),
        (["compare", "--out", "{tmp}/c", "--schemes", "rope,t5", "--preset", "tiny"], "unknown ['t5']"),
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
    ],
)
def test_cli_errors_are_one_line_and_nonzero(argv, message, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_cli_rejects_unknown_encoding_and_bad_lengths(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--encoding", "xpos", "--out", "x"])
    assert e.value.code == 2 and "invalid choice: 'xpos'" in capsys.readouterr().err
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
