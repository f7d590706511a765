"""How a task's text reaches the model: a :class:`Frame` around the haystack, and the :class:`Trial` it
builds.

A trial is one haystack and the questions asked over it. The model reads the instruction and the haystack
once (the trial's ``prefix``); each question continues that prefix with its own short tail (the question,
the end of the user's turn, the start of the answer), so that the prefix's forward pass is shared by every
question (:mod:`posenc.real.continuation`). In a model with a chat template the instruction, the haystack and
the question are the user's turn and the assistant's turn starts with the answer prefix, as RULER asks
(Hsieh et al. 2024, arXiv:2404.06654: its templates and answer prefixes); without one, the same text
plainly.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Frame", "Question", "Trial", "encode", "encode_many", "start_tokens"]

_HAYSTACK = "\x1fposenc-haystack\x1f"  # markers no chat template writes, split out after rendering
_QUESTION = "\x1fposenc-question\x1f"


def encode(tokenizer, text: str) -> list[int]:
    """The token ids of ``text`` without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_many(tokenizer, texts: list[str]) -> list[list[int]]:
    """:func:`encode` of each of ``texts``, in one batched call where the tokenizer takes a list."""
    if not texts:
        return []
    try:
        out = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    except (TypeError, ValueError):  # a tokenizer of one text at a time
        out = None
    if out is None or len(out) != len(texts) or not all(isinstance(ids, list) for ids in out):
        return [encode(tokenizer, text) for text in texts]
    return [list(ids) for ids in out]


def start_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text by default (a BOS token, or none)."""
    with_special = list(tokenizer("a")["input_ids"])
    plain = encode(tokenizer, "a")
    cut = len(with_special) - len(plain)
    return with_special[:cut] if cut > 0 and with_special[cut:] == plain else []


@dataclass(frozen=True)
class Question:
    """One question over a trial's haystack.

    ids: the tokens that continue the prefix (question, end of turn, answer prefix); expected: the strings
    whose recall in the answer is its score; depth: where its (first) needle was asked to go in the
    haystack, 0 (the start) to 1 (the end), None for a task without needles; needle_at: that needle's token
    index in the prefix (None likewise); max_new_tokens: the most tokens the answer may take; gold: the
    tokens of the gold answer after ``ids`` (a space and the expected strings as the task joins them), whose
    teacher-forced likelihood is the question's continuous score.
    """

    ids: tuple[int, ...]
    expected: tuple[str, ...]
    depth: float | None
    needle_at: int | None
    max_new_tokens: int
    gold: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trial:
    """One haystack (``prefix``: the instruction and the haystack, token ids) and its ``questions``; ``task``,
    ``length`` and ``index`` (its number among the task's trials at this length) name it; the haystack is
    ``prefix[haystack_at:]``.

    For every question, ``len(prefix) + len(q.ids) + q.max_new_tokens <= length``, with equality for the
    longest: nothing the model reads or writes goes past ``length`` positions.

    ``needle_spans``: each needle's ``(start, end)`` token indices in ``prefix``, in order; without them the
    prefix is the trial's needle-free :attr:`control`.
    """

    task: str
    index: int
    length: int
    prefix: tuple[int, ...]
    questions: tuple[Question, ...]
    haystack_at: int = 0
    needle_spans: tuple[tuple[int, int], ...] = ()

    @property
    def control(self) -> tuple[int, ...] | None:
        """The prefix with every needle taken out: the same instruction and haystack, the needles absent
        (what the model can guess of an answer without reading it); None for a trial without needles."""
        if not self.needle_spans:
            return None
        out, at = [], 0
        for start, end in self.needle_spans:
            out += self.prefix[at:start]
            at = end
        return tuple(out + list(self.prefix[at:]))

    def question_id(self, q: int) -> str:
        """The id of question ``q``: the same for every method, so that trials pair across methods (the
        length is part of it: a task's trial ``index`` at two lengths is two haystacks)."""
        return f"{self.task}/{self.length}/{self.index}/{q}"


class Frame:
    """The text around a haystack in ``tokenizer``'s chat template (``chat`` and the tokenizer has one) or
    plainly.

    ``instruction(text)`` -> the prefix's first tokens (template start, instruction); ``continuation(question,
    answer_prefix)`` -> a question's tokens after the haystack.
    """

    def __init__(self, tokenizer, chat: bool = True):
        self.tokenizer = tokenizer
        self.chat = bool(chat and getattr(tokenizer, "chat_template", None))
        self._after: str | None = None

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def _rendered(self, instruction: str) -> tuple[str, str]:
        """The template's text before the haystack (its start and the instruction) and after the question
        (the end of the user's turn and the start of the assistant's)."""
        content = instruction + _HAYSTACK + _QUESTION
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        if text.count(_HAYSTACK) != 1 or text.count(_HAYSTACK + _QUESTION) != 1:
            raise ValueError("the tokenizer's chat template does not keep the user's text as written")
        before, rest = text.split(_HAYSTACK)
        return before, rest.split(_QUESTION)[1]

    def instruction(self, text: str) -> list[int]:
        """The prefix's tokens before the haystack: the template's start (a rendered template writes its own
        special tokens as text) and ``text``, or the tokenizer's start tokens and ``text``."""
        if self.chat:
            return self.encode(self._rendered(text)[0])
        return start_tokens(self.tokenizer) + self.encode(text)

    def continuation(self, question: str, answer_prefix: str) -> list[int]:
        """A question's tokens after the haystack: ``question``, the end of the user's turn and the
        assistant's turn starting with ``answer_prefix`` (plainly: the question and the answer prefix as
        written, which carries the space or line break before it). The answer prefix never ends with
        whitespace: the space before the answer is the answer's to write."""
        if self.chat:
            if self._after is None:  # the same for every question: rendered once
                self._after = self._rendered("")[1]
            return self.encode(question + self._after + answer_prefix.strip())
        return self.encode(question + answer_prefix.rstrip())
