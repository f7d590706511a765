"""posenc.real.tasks with the character tokenizer: trials of exactly the asked length whose decoded text
holds what they expect where they say, the same for a seed whatever the number of trials, lengths under the
minimum and bad arguments refused by name, and RULER's score."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.real.passkey import passkey_prompts
from posenc.real.tasks import DEFAULT_TASKS, ESSAY_SOURCE, TASKS, check_tasks, make_trials, min_length, score
from posenc.real.tasks.haystack import essay_text

from .fake_tokenizer import CharTokenizer
from .task_checks import check_lengths, check_trial

TOK = CharTokenizer(bos=True)
LENGTH = 9000  # characters: room for every task's haystack to hold many units


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("chat", [True, False])
def test_every_task_fills_its_length_and_holds_what_it_expects(task, chat):
    trials = make_trials(task, TOK, LENGTH, 3, seed=5, chat=chat)
    assert [t.index for t in trials] == [0, 1, 2]
    for trial in trials:
        check_trial(trial, TOK.decode)
        assert len(trial.questions) == TASKS[task].questions
        if chat:
            assert TOK.decode(trial.prefix).startswith("<user>")
            assert all("</user><bot>" in TOK.decode(q.ids) for q in trial.questions)
        else:
            assert trial.prefix[0] == 1 and "<" not in TOK.decode(trial.prefix[:50])


@pytest.mark.parametrize("task", [t for t in TASKS if TASKS[t].max_questions is None])
def test_needles_go_in_at_increasing_depths_over_the_grid(task):
    trial = make_trials(task, TOK, LENGTH, 1, seed=0, questions=4)[0]
    depths = [q.depth for q in trial.questions]
    if task in ("niah_multivalue", "niah_multiquery"):  # 4 needles a question: question j's first is j
        assert depths == [j / 15 for j in range(4)]
    elif task == "vt":  # a chain's first statement is where the random interleaving put it
        assert len(set(depths)) == 4 and all(d * 19 == round(d * 19) for d in depths)
    else:
        assert depths == [0, 1 / 3, 2 / 3, 1]
    order = sorted(range(4), key=lambda j: depths[j])
    at = [trial.questions[j].needle_at for j in order]
    assert at == sorted(at) and len(set(at)) == 4


def test_a_single_needle_moves_over_the_trials_whatever_their_number():
    depths = [t.questions[0].depth for t in make_trials("passkey", TOK, 2000, 8, seed=0)]
    assert depths == [0.5, 0.0, 0.75, 0.25, 0.625, 0.125, 0.875, 0.375]
    one = make_trials("niah_noise", TOK, 2000, 3, seed=0, questions=1)
    assert [t.questions[0].depth for t in one] == depths[:3]


def test_the_passkey_task_hides_the_teacher_forced_prompts_keys():
    keys = [p.key for p in passkey_prompts(TOK, 1500, 6, seed=4)]
    assert [t.questions[0].expected[0] for t in make_trials("passkey", TOK, 1500, 6, seed=4)] == keys


@pytest.mark.parametrize("task", list(TASKS))
def test_a_trial_depends_on_its_seed_and_index_not_on_the_number_drawn(task):
    few = make_trials(task, TOK, 4000, 2, seed=3)
    many = make_trials(task, TOK, 4000, 4, seed=3)
    assert many[:2] == few
    other = make_trials(task, TOK, 4000, 2, seed=4)
    assert all(a.prefix != b.prefix for a, b in zip(few, other, strict=True))
    assert few[0].prefix != few[1].prefix
    ids = {t.question_id(q) for t in many for q in range(len(t.questions))}
    assert len(ids) == sum(len(t.questions) for t in many)  # names pair questions across methods


@pytest.mark.parametrize("task", list(TASKS))
def test_the_minimum_length_is_taken_and_one_less_is_refused_naming_it(task):
    least = min_length(task, TOK)
    for seed in range(4):
        for trial in make_trials(task, TOK, least, 2, seed=seed):
            check_lengths(trial)
            if task in ("cwe", "fwe"):  # the smallest list still ranks its words unambiguously
                check_trial(trial, TOK.decode)
    message = rf"{task}: length {least - 1} is too short: .* at least {least} tokens"
    with pytest.raises(ValueError, match=message):
        make_trials(task, TOK, least - 1, 1, seed=0)


def test_more_questions_need_more_room():
    assert (
        min_length("niah_noise", TOK, questions=8)
        > min_length("niah_noise", TOK)
        > min_length("niah_noise", TOK, questions=1)
    )
    assert min_length("kv", TOK, chat=False) < min_length("kv", TOK)  # no template around the text


@settings(max_examples=25, deadline=None)
@given(
    task=st.sampled_from(list(TASKS)),
    extra=st.integers(0, 3000),
    seed=st.integers(0, 10**6),
    chat=st.booleans(),
)
def test_any_length_from_the_minimum_is_filled_exactly(task, extra, seed, chat):
    length = min_length(task, TOK, chat=chat) + extra
    (trial,) = make_trials(task, TOK, length, 1, seed=seed, chat=chat)
    check_lengths(trial)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "niah"}, r"task 'niah' is not one of niah_single_1, .*did you mean"),
        ({"length": 0}, r"length must be an integer >= 1, not 0"),
        ({"length": 1.5e4}, r"length must be an integer >= 1, not 15000.0"),
        ({"length": True}, r"length must be an integer >= 1, not True"),
        ({"n_trials": -1}, r"n_trials must be an integer >= 0, not -1"),
        ({"seed": -2}, r"seed must be an integer >= 0, not -2"),
        ({"seed": "0"}, r"seed must be an integer >= 0, not '0'"),
        ({"chat": "yes"}, r"chat must be True or False, not 'yes'"),
        ({"questions": 0}, r"questions for kv must be an integer >= 1 \(or None for 4\), not 0"),
        ({"task": "cwe", "questions": 2}, r"questions for cwe must be 1 to 1 \(or None for 1\), not 2"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, message):
    args = {"task": "kv", "length": 4000, "n_trials": 1, "seed": 0, "chat": True, "questions": None} | kwargs
    task, length, n = args.pop("task"), args.pop("length"), args.pop("n_trials")
    with pytest.raises(ValueError, match=message):
        make_trials(task, TOK, length, n, **args)


def test_min_length_refuses_an_unknown_task_and_bad_questions():
    with pytest.raises(ValueError, match=r"task 'passkeys' is not one of .*did you mean 'passkey'"):
        min_length("passkeys", TOK)
    with pytest.raises(ValueError, match=r"questions for vt must be"):
        min_length("vt", TOK, questions=-1)
    with pytest.raises(ValueError, match=r"chat must be True or False, not 1"):
        min_length("vt", TOK, chat=1)
    assert make_trials("vt", TOK, 4000, 0, seed=0) == []


def test_check_tasks_takes_known_names_once():
    assert check_tasks(["vt", "kv"]) == ["vt", "kv"]
    assert check_tasks("niah_noise, cwe") == ["niah_noise", "cwe"]
    allowed = re.escape(", ".join(TASKS))
    for bad, why in [
        (["vt", "kvv"], r"unknown task 'kvv' \(did you mean 'kv'\?\)"),
        (["vt", "vt"], r"vt given more than once"),
        ([], r"give one or more task names"),
        ("", r"give one or more task names"),
    ]:
        with pytest.raises(ValueError, match=rf"--tasks {re.escape(repr(bad))}: {why}.*allowed: {allowed}"):
            check_tasks(bad)


def test_every_task_is_registered_with_its_source_and_answer_budget():
    assert list(TASKS) == [
        "niah_single_1",
        "niah_single_2",
        "niah_single_3",
        "niah_multikey_1",
        "niah_multikey_2",
        "niah_multikey_3",
        "niah_multivalue",
        "niah_multiquery",
        "vt",
        "cwe",
        "fwe",
        "kv",
        "passkey",
        "niah_noise",
        "niah_essay",
        "niah_multikey",
    ]
    assert DEFAULT_TASKS == tuple(list(TASKS)[:13])  # the many-needle variants run only when named
    for name, task in TASKS.items():
        assert task.name == name and task.title and re.search(r"arXiv:\d{4}\.\d{5}", task.source)
    ruler = {"niah_noise": 128, "niah_multikey": 128, "vt": 30, "cwe": 120, "fwe": 50}  # RULER's constants
    assert {n: TASKS[n].max_new_tokens for n in ruler} == ruler
    assert "2404.06654" in TASKS["vt"].source and "2307.03172" in TASKS["kv"].source
    assert "2305.16300" in TASKS["passkey"].source


def test_the_essay_is_the_python_documentation_in_sorted_topic_order():
    from pydoc_data.topics import topics

    first, second = (topics[k].splitlines()[0] for k in sorted(topics)[:2])
    text = essay_text(len(topics[sorted(topics)[0]]) + 3000)
    assert text.startswith(first) and second in text[len(first) :]
    assert "  " not in text and "\n" not in text and "*****" not in text
    assert essay_text(3000) == text[:3000]
    assert "PSF License" in ESSAY_SOURCE and "pydoc_data.topics" in ESSAY_SOURCE


def test_the_essay_goes_on_with_the_standard_librarys_docstrings():
    from pydoc_data.topics import topics

    prose = sum(len(" ".join(t.split())) for t in topics.values())
    text = essay_text(prose + 20_000)
    first = Path(importlib.util.find_spec("__future__").origin)  # the first file by path
    doc = " ".join(ast.get_docstring(ast.parse(first.read_text())).split())
    assert len(text) == prose + 20_000 and doc[:200] in text[prose - 10_000 :]


def test_score_is_the_recall_of_the_expected_strings_ignoring_case():
    assert score(["1234567"], "The number is 1234567.") == 1.0
    assert score(["ABCDE", "FGHIJ", "KLMNO", "PQRST"], "abcde, Fghij and nothing else") == 0.5
    assert score(["apple", "pear"], "") == 0.0
    assert score(["key"], "monkey") == 1.0  # a substring counts, as in RULER
    for bad in ([], "abc", [""], [3]):
        with pytest.raises(ValueError, match="expected must"):
            score(bad, "text")
    with pytest.raises(ValueError, match="answer_text must be a string"):
        score(["a"], None)


@given(n=st.integers(1, 6), data=st.data())
def test_score_is_the_share_of_expected_strings_in_the_answer(n, data):
    expected = [f"<{i}x>" for i in range(n)]
    found = data.draw(st.sets(st.integers(0, n - 1)))
    noise = data.draw(st.text(st.characters(codec="ascii", categories=["L"]), max_size=10))
    answer = noise + " ".join(expected[i].upper() for i in sorted(found))
    assert score(expected, answer) == len(found) / n


# RULER's synthetic.yaml (Hsieh et al. 2024): needles of each kind in one haystack, keys among them, values
# a question asks, questions per haystack
RULER_COUNTS = {
    "niah_single_1": (1, 1, 1),
    "niah_single_2": (1, 1, 1),
    "niah_single_3": (1, 1, 1),
    "niah_multikey_1": (4, 4, 1),
    "niah_multivalue": (4, 1, 4),
    "niah_multiquery": (4, 4, 4),
}
HAYSTACK_OF_NEEDLES = ("niah_multikey_2", "niah_multikey_3")


@settings(max_examples=25, deadline=None)
@given(
    task=st.sampled_from([*RULER_COUNTS, *HAYSTACK_OF_NEEDLES, "vt"]),
    extra=st.integers(0, 4000),
    seed=st.integers(0, 10_000),
)
def test_rulers_tasks_hold_exactly_rulers_counts(task, extra, seed):
    length = min_length(task, TOK) + 1500 + extra
    (trial,) = make_trials(task, TOK, length, 1, seed=seed)
    assert len(trial.questions) == 1
    (q,) = trial.questions
    haystack = TOK.decode(trial.prefix[trial.haystack_at :])
    if task == "vt":  # one chain of 4 hops: its value and 4 assignments, and the solved example's chain
        assert len(q.expected) == 5 and len(trial.needle_spans) == 5
        assert len(re.findall(r"VAR [A-Z]{5} = \d{5}\.", haystack)) == 1
        return
    needles = re.findall(r"One of the special magic \w+ for (\S+) is: (\S+)\.", haystack)
    mine = [TOK.decode(trial.prefix[a:b]) for a, b in trial.needle_spans]
    if task in HAYSTACK_OF_NEEDLES:  # one real needle; every other line is a distractor of the same form
        assert len(mine) == 1 and len(needles) > 10 and len(q.expected) == 1
        assert sum(v == q.expected[0] for _, v in needles) == 1
        return
    count, keys, values = RULER_COUNTS[task]
    assert len(needles) == len(mine) == count and len({k for k, _ in needles}) == keys
    asked = re.search(r"for (.+?) mentioned", TOK.decode(q.ids)).group(1).replace(", and ", ", ").split(", ")
    assert len(asked) == (4 if task == "niah_multiquery" else 1)
    assert len(q.expected) == values and sorted(q.expected) == sorted(v for k, v in needles if k in asked)
