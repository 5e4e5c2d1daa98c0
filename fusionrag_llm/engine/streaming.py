"""Streaming generation: text deltas as tokens arrive, stats at the end."""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import torch

from fusionrag_llm.engine.decode import check_token_ids, greedy_tokens, teacher_forced
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.errors import FusionRAGError


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
        self._model = engine.model
        self._state = state
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

    def score(self, continuation: Sequence[int]) -> torch.Tensor:
        """Teacher-forced logits ``[len(continuation), vocab]``: row i predicts ``continuation[i]``.

        Reuses this request's prefilled context (no second prefill): the generated tokens' KV is
        dropped and ``continuation`` runs after the prompt instead. Call it once the stream is
        exhausted (it ends the stream); ``continuation`` may hold up to ``max_new_tokens + 1`` tokens.
        Ids outside the vocabulary are refused before the stream is touched.
        """
        continuation = check_token_ids(continuation, self._model.cfg.vocab_size, "continuation")
        self._tokens.close()
        state, cache = self._state, self._state.cache
        prompt_len = state.next_position
        if len(continuation) - 1 > cache.capacity - prompt_len:
            raise FusionRAGError(
                f"cannot score {len(continuation)} tokens: this stream has room for "
                f"{cache.capacity - prompt_len + 1} (max_new_tokens + 1); stream with a larger max_new_tokens"
            )
        cache.valid[prompt_len : cache.length] = False  # forget the generated tokens' KV
        cache.length = prompt_len
        return teacher_forced(self._model, cache, state.last_logits, prompt_len, continuation[:-1])
