"""Streaming generation: text deltas as tokens arrive, stats at the end."""

from __future__ import annotations

import time
from typing import Iterator

from fusionrag_llm.engine.decode import greedy_tokens
from fusionrag_llm.engine.stats import GenerationStats


class GenerationStream:
    """Iterate for text deltas; afterwards ``text``, ``token_ids`` and ``stats`` hold the whole answer.

    The prefill has already run when the stream is created, so ``stats.ttft_s`` is known at once.
    """

    def __init__(self, engine, state, prompt_ids: list[int], max_new_tokens: int):
        self.stats: GenerationStats = state.stats
        self.prompt_ids = prompt_ids
        self.token_ids: list[int] = []
        self.text = ""
        self._tokenizer = engine.tokenizer
        self._tokens = greedy_tokens(engine.model, state.cache, state.last_logits, state.next_position,
                                     max_new_tokens, engine.tokenizer.stop_ids)  # fmt: skip

    def __iter__(self) -> Iterator[str]:
        start = time.perf_counter()
        for token in self._tokens:
            self.token_ids.append(token)
            text = self._tokenizer.decode(self.token_ids)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
                continue
            delta, self.text = text[len(self.text) :], text
            self.stats.generated_tokens = len(self.token_ids)
            self.stats.decode_s = time.perf_counter() - start
            if delta:
                yield delta
        final = self._tokenizer.decode(self.token_ids)
        delta, self.text = final[len(self.text) :], final  # a tail held back as incomplete UTF-8
        self.stats.generated_tokens = len(self.token_ids)
        self.stats.decode_s = time.perf_counter() - start
        if delta:
            yield delta
