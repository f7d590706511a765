"""Passkey retrieval prompts for a real model, in its chat template, of an exact length in its tokens.

A five-digit key is hidden at a chosen depth of filler text and asked for at the end (Mohtashami & Jaggi
2023, "Landmark Attention", arxiv.org/abs/2305.16300: their needle and filler sentences, the same the
laboratory uses; the needle, instruction and question are :mod:`posenc.real.tasks.passkey`'s, the
generated passkey task's). The model is asked as a user would ask it: the instruction, the haystack and the
question are the user's turn of the model's chat template, and the assistant's turn starts with "The pass
key is" (and the space before the key, where the tokenizer makes a token of its own of it); a model
without a chat template gets the same text plainly. A trial is a hit when the model's most likely next
token equals the key's at every one of the key's tokens, which is what greedy decoding after the prompt
would write (one teacher-forced pass instead of a decoding loop).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from posenc.lab.passkey import REPEAT_FILLER
from posenc.real.tasks.haystack import text_filler
from posenc.real.tasks.passkey import ANSWER_PREFIX, INSTRUCTION, KEY_DIGITS, NEEDLE, QUESTION
from posenc.real.tasks.prompt import encode, start_tokens

__all__ = ["KEY_DIGITS", "PasskeyPrompt", "passkey_prompts", "start_tokens"]

_HAYSTACK = "\x1fposenc-haystack\x1f"  # a marker no chat template writes, split out after rendering


@dataclass(frozen=True)
class PasskeyPrompt:
    """One trial: ``ids`` (prompt and answer, exactly the requested length), of which the last
    ``answer_len`` are the key's tokens; the key, the needle's relative ``depth`` in the filler (0 start,
    1 end) and the token index ``needle_at`` where the needle starts."""

    ids: tuple[int, ...]
    answer_len: int
    key: str
    depth: float
    needle_at: int


def _frame(tokenizer, chat: bool) -> tuple[list[int], str]:
    """The token ids before the haystack (the instruction) and the text after it (the question and the
    answer prefix)."""
    template = getattr(tokenizer, "chat_template", None)
    if chat and template:
        messages = [{"role": "user", "content": INSTRUCTION + _HAYSTACK + QUESTION}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text.count(_HAYSTACK) != 1:
            raise ValueError("the tokenizer's chat template does not keep the user's text as written")
        before, after = text.split(_HAYSTACK)
        # A rendered template writes its own special tokens as text (transformers tokenizes it likewise)
        return encode(tokenizer, before), after + ANSWER_PREFIX.strip()
    return start_tokens(tokenizer) + encode(tokenizer, INSTRUCTION), QUESTION + ANSWER_PREFIX


def _question_and_answer(tokenizer, after_text: str, key: str) -> tuple[list[int], list[int]]:
    """The tokens of the question (ending "The pass key is") and of the key as they follow it, tokenized
    together as a model reads them. A whitespace token between the two, which some tokenizers make of the
    space before digits, ends the question: it says nothing about the key, and a model that would write
    "is a 12345" or "is: 12345" has still retrieved it."""
    question = encode(tokenizer, after_text)
    joined = encode(tokenizer, after_text + " " + key)
    if joined[: len(question)] != question:
        raise ValueError(
            "this tokenizer merges the passkey with the text before it, so its tokens cannot be scored "
            "apart; run with --passkey-trials 0"
        )
    answer = joined[len(question) :]
    while len(answer) > 1 and not tokenizer.decode(answer[:1]).strip():
        question, answer = question + answer[:1], answer[1:]
    return question, answer


def _filler(tokenizer, room: int) -> tuple[list[int], list[int]]:
    """At least ``room`` filler tokens, and the indices of the tokens that start a sentence (where a needle
    goes in without splitting one; just [0] for a tokenizer that cannot map tokens to characters)."""
    return text_filler(tokenizer, REPEAT_FILLER * (room // 8 + 2))  # a filler sentence takes over 8 tokens


def _keys(seed: int, trials: int) -> list[str]:
    # One generator per trial: the i-th key is the same whatever the number of trials.
    return [
        str(random.Random(f"posenc-passkey-{seed}-{i}").randrange(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS))
        for i in range(trials)
    ]


def passkey_prompts(
    tokenizer, length: int, trials: int, *, seed: int = 0, chat: bool = True
) -> list[PasskeyPrompt]:
    """``trials`` prompts of exactly ``length`` tokens with the needle at evenly spaced depths (0 to 1; 0.5
    for one trial), at the start of the filler sentence there, and keys drawn from ``seed``. ``chat``: use
    the tokenizer's chat template if it has one.

    Raises ValueError when ``length`` cannot hold the instruction, the needle, the question and the key.
    """
    before, after_text = _frame(tokenizer, chat)
    filler, bounds = _filler(tokenizer, length)
    prompts = []
    for i, key in enumerate(_keys(seed, trials)):
        needle = encode(tokenizer, " " + NEEDLE.format(key=key))  # a sentence like the filler's
        after, answer = _question_and_answer(tokenizer, after_text, key)
        room = length - len(before) - len(needle) - len(after) - len(answer)
        if room < 0:
            raise ValueError(
                f"passkey length {length} is too short: this model's prompt (instruction, needle, question) "
                f"and key take {length - room} tokens; use longer --lengths or --passkey-trials 0"
            )
        depth = i / (trials - 1) if trials > 1 else 0.5
        cut = max(b for b in bounds if b <= round(depth * room))  # at the start of a filler sentence
        ids = before + filler[:cut] + needle + filler[cut:room] + after + answer
        prompts.append(PasskeyPrompt(tuple(ids), len(answer), key, depth, len(before) + cut))
    return prompts
