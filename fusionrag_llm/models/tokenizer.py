"""The tokenizer as the engine uses it: plain encode/decode plus the chat template.

Segments are tokenized on their own and never get special tokens added implicitly, so a chunk's
token ids are the same at ingestion and at query time.
"""

from __future__ import annotations

from typing import Any, Sequence

CHAT_SENTINEL = "\x00FUSIONRAG_USER_CONTENT\x00"

# ChatML, used when a tokenizer ships without a template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTokenizer:
    """Wraps a `transformers` tokenizer; ``hf`` stays reachable for framework adapters."""

    def __init__(self, hf: Any, extra_stop_ids: Sequence[int] = ()):
        self.hf = hf
        if not getattr(hf, "chat_template", None):
            hf.chat_template = CHATML_TEMPLATE
        stop = set(extra_stop_ids)
        for token in (hf.eos_token, "<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            token_id = hf.convert_tokens_to_ids(token) if token else None
            if token_id is not None and token_id != hf.unk_token_id:
                stop.add(int(token_id))
        self.stop_ids = frozenset(stop)

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def chat_frame(self, system: str | None) -> tuple[str, str]:
        """Template text before and after one user message (with the given or default system prompt)."""
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": CHAT_SENTINEL})
        rendered = self.render_chat(messages)
        head, sentinel, tail = rendered.partition(CHAT_SENTINEL)
        if not sentinel:
            raise ValueError("the chat template dropped the user message; cannot frame prompts with it")
        return head, tail

    def split_generation_prompt(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """The rendered chat without and with only its generation prompt (e.g. ``<|im_start|>assistant``)."""
        with_prompt = self.render_chat(messages, add_generation_prompt=True)
        without = self.render_chat(messages, add_generation_prompt=False)
        if with_prompt.startswith(without) and len(with_prompt) > len(without):
            return without, with_prompt[len(without) :]
        last = messages[-1]["content"]  # a template without a generation prompt: the last turn's end is the suffix
        cut = with_prompt.rfind(last) + len(last) if last else len(with_prompt)
        return with_prompt[:cut], with_prompt[cut:] or with_prompt[-1:]
