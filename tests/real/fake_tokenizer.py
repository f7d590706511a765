"""A character-level tokenizer with the interface posenc.real uses, for tests that need no real model."""


class CharTokenizer:
    """One token per character (its code point); optional BOS (id 1) and chat template."""

    def __init__(self, bos: bool = False, chat: bool = True):
        self.bos = bos
        self.chat_template = "<user>{content}</user><bot>" if chat else None

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        ids = [ord(c) for c in text]
        out = {"input_ids": ([1] if self.bos and add_special_tokens else []) + ids}
        if return_offsets_mapping:
            out["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return out

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i != 1)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        assert not tokenize and add_generation_prompt
        return self.chat_template.format(content=messages[0]["content"])
