"""Checks of a generated trial against its own decoded text, shared by the character-tokenizer tests and the
SmolLM2-tokenizer tests: each parses what a reader of the prompt would see (the needles, the JSON, the word
list, the assignments) and compares it with what the trial expects."""

import json
import re
from collections import Counter

from posenc.real.tasks import TASKS


def check_lengths(trial):
    """Nothing read or written goes past the length; the longest question's answer ends exactly there."""
    ends = [len(trial.prefix) + len(q.ids) + q.max_new_tokens for q in trial.questions]
    assert max(ends) == trial.length and all(e <= trial.length for e in ends)
    assert all(q.max_new_tokens == TASKS[trial.task].max_new_tokens for q in trial.questions)
    assert 0 < trial.haystack_at < len(trial.prefix)


def _texts(trial, decode):
    haystack = decode(trial.prefix[trial.haystack_at :])
    questions = [decode(q.ids) for q in trial.questions]
    return haystack, questions


def _check_needle_at(trial, q, decode, starts_with: str, before_ends: str):
    """Question ``q``'s needle starts at ``needle_at`` with ``starts_with``, right after a whole unit of the
    haystack (text ending in ``before_ends``), about where its depth says."""
    after = decode(trial.prefix[q.needle_at :])
    assert after.lstrip(" \n,").startswith(starts_with), (after[:120], starts_with)  # after its separator
    before = decode(trial.prefix[trial.haystack_at : q.needle_at])
    assert before.rstrip().endswith(before_ends), before[-80:]
    where = (q.needle_at - trial.haystack_at) / (len(trial.prefix) - trial.haystack_at)
    assert abs(where - q.depth) < 0.12, (where, q.depth)


def _needles(haystack: str, kind: str) -> list[tuple[str, str]]:
    return re.findall(rf"One of the special magic {kind} for (\S+) is: (\S+)\.(?=\s|$)", haystack)


UUID_VALUES = ("niah_multikey", "niah_multikey_3", "niah_single_3")


def check_niah(trial, decode):
    kind = "uuids" if trial.task in UUID_VALUES else "numbers"
    haystack, questions = _texts(trial, decode)
    found = _needles(haystack, kind)
    keys = [k for k, _ in found]
    values: dict[str, list[str]] = {}
    for k, v in found:
        values.setdefault(k, []).append(v)
    for q, text in zip(trial.questions, questions, strict=True):
        asked = re.search(r"for (.+?) mentioned", text).group(1).replace(", and ", ", ").split(", ")
        got = [v for k in asked for v in values[k]]
        assert sorted(got) == sorted(q.expected)  # the asked keys' values in the haystack, and no others
        per_key = 4 if trial.task == "niah_multivalue" else 1
        assert (
            len(q.expected) == len(asked) * per_key == (4 if trial.task.endswith(("value", "query")) else 1)
        )
        needle = f"One of the special magic {kind} for {asked[0]} is: {got[0]}."
        _check_needle_at(trial, q, decode, needle, ".")  # after a sentence, or after another needle
    if trial.task == "niah_multivalue":
        assert len(set(keys)) == len(trial.questions) and all(len(v) == 4 for v in values.values())
    else:
        assert len(set(keys)) == len(keys)  # keys distinct within the trial
    assert len({v for _, v in found}) == len(found)  # and values too


def check_vt(trial, decode):
    """Following the assignments in the text from the asked value gives exactly the expected variables, each
    assigned after its source."""
    haystack, questions = _texts(trial, decode)
    holds: dict[str, str] = {}
    for name, source in re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})\.", haystack):
        assert name not in holds
        holds[name] = holds[source[4:]] if source.startswith("VAR ") else source  # KeyError: used before set
    for q, text in zip(trial.questions, questions, strict=True):
        value = re.search(r"assigned the value (\d{5}) in the text", text).group(1)
        assert sorted(n for n, v in holds.items() if v == value) == sorted(q.expected)
        assert len(q.expected) == 5 and f"5 variables are assigned the value {value}" in text
        _check_needle_at(trial, q, decode, f"VAR {q.expected[0]} = {value}.", ".")
    assert len(set(holds.values())) == len(trial.questions)


def check_cwe(trial, decode):
    """The 10 expected words are each more frequent than every other word of the numbered list."""
    haystack, _ = _texts(trial, decode)
    items = re.findall(r"(\d+)\. ([a-z]+)", haystack)
    assert [int(n) for n, _ in items] == list(range(1, len(items) + 1))
    counts = Counter(w for _, w in items)
    (q,) = trial.questions
    assert len(set(q.expected)) == 10 and set(q.expected) <= set(counts)
    others = [c for w, c in counts.items() if w not in q.expected]
    assert min(counts[w] for w in q.expected) > max(others)
    assert sum(others) >= sum(counts[w] for w in q.expected)  # uncommon words are the bulk of the list
    return {counts[w] for w in q.expected}, set(others)


def check_fwe(trial, decode):
    """The 3 expected words are the most frequent coded words, strictly."""
    haystack, _ = _texts(trial, decode)
    counts = Counter(w for w in haystack.split() if w != "...")
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in counts)
    (q,) = trial.questions
    ranked = [c for _, c in counts.most_common()]
    assert {w for w, _ in counts.most_common(3)} == set(q.expected) and ranked[2] > ranked[3]
    assert haystack.split().count("...") > ranked[0]  # rank 1 is the noise


def check_kv(trial, decode):
    """The haystack is a JSON object; each asked key's value in it is the expected one."""
    haystack, questions = _texts(trial, decode)
    pairs = json.loads(haystack, object_pairs_hook=lambda p: p)
    data = dict(pairs)
    assert len(data) == len(pairs)  # keys distinct
    for q, text in zip(trial.questions, questions, strict=True):
        key = re.search(r'Key: "([0-9a-f-]{36})"', text).group(1)
        assert (data[key],) == q.expected
        _check_needle_at(trial, q, decode, f'"{key}": "{q.expected[0]}",', ",")  # after a whole pair


def check_passkey(trial, decode):
    (q,) = trial.questions
    (key,) = q.expected
    haystack, (text,) = _texts(trial, decode)
    assert re.findall(r"The pass key is (\d{5})\. Remember it\. \1 is the pass key\.", haystack) == [key]
    assert text.rstrip().endswith("The pass key is")
    _check_needle_at(trial, q, decode, f"The pass key is {key}. Remember it.", ".")


CHECKS = {
    **{f"niah_single_{i}": check_niah for i in (1, 2, 3)},
    **{f"niah_multikey_{i}": check_niah for i in (1, 2, 3)},
    "niah_noise": check_niah,
    "niah_essay": check_niah,
    "niah_multikey": check_niah,
    "niah_multivalue": check_niah,
    "niah_multiquery": check_niah,
    "vt": check_vt,
    "cwe": check_cwe,
    "fwe": check_fwe,
    "kv": check_kv,
    "passkey": check_passkey,
}


def check_trial(trial, decode):
    """Every check of ``trial`` (its lengths and its task's content)."""
    check_lengths(trial)
    return CHECKS[trial.task](trial, decode)
