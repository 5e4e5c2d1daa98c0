"""Streaming generation: text deltas as tokens arrive, stats at the end."""

from __future__ import annotations

import weakref
from typing import Iterator, Sequence

import torch

from fusionrag_llm.engine.decode import check_token_ids
from fusionrag_llm.errors import FusionRAGError

UNFINISHED_UTF8 = "\ufffd"


class IncrementalText:
    """Text deltas of a growing token list, decoding a short window per token instead of everything.

    The window starts at the last token whose text was already emitted, so tokenizers that decode
    a token differently at the start of a text (a leading space) give the same deltas as decoding
    the whole list; a delta is held back while it ends in an incomplete UTF-8 sequence.
    """

    def __init__(self, decode):
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # window start
        self._read = 0  # tokens whose text is emitted

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.decode(self.ids[self._prefix : self._read])
        after = self.decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(UNFINISHED_UTF8):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return self._emit(after[len(before) :])

    def follow(self, token_ids: Sequence[int]) -> str:
        """Catch up with ``token_ids``, a list this one's ids start (a sequence's growing answer):
        add the tokens not seen yet; returns the whole text so far."""
        for token in token_ids[len(self.ids) :]:
            self.add(token)
        return self.text

    def flush(self) -> str:
        """What the held-back tokens decode to once no more tokens come."""
        if self._read == len(self.ids):
            return ""
        before = self.decode(self.ids[self._prefix : self._read])
        after = self.decode(self.ids[self._prefix :])
        self._read = len(self.ids)
        return self._emit(after[len(before) :])

    def _emit(self, delta: str) -> str:
        self.text += delta
        return delta


class AnswerText:
    """The text of one sequence's answer as it grows: ``pull`` hands out what is new since the last call.

    Text that could still turn out to be the start of a stop string is held back, and the stop string
    itself is never handed out; once the sequence has finished, ``pull`` also flushes what an
    incomplete UTF-8 sequence held back. Plain bookkeeping over ``seq.token_ids``; it never steps.
    """

    def __init__(self, seq, decode):
        self.seq = seq
        self._text = IncrementalText(decode)
        self._sent = 0  # characters of the decoded text handed out
        self._flushed = False

    @property
    def text(self) -> str:
        """The text handed out so far."""
        return self._text.text[: self._sent]

    @property
    def token_ids(self) -> list[int]:
        """The tokens pulled so far."""
        return self._text.ids

    def pull(self) -> str:
        """The text that is new and final since the last call ("" when there is none)."""
        seq = self.seq
        self._text.follow(seq.token_ids)
        if seq.finished and not self._flushed:
            self._flushed = True
            if seq.error is None:
                self._text.flush()
        return self._release()

    def _release(self) -> str:
        """New text that can no longer turn out to be part of a stop string (never the stop string)."""
        text, seq = self._text.text, self.seq
        if seq.finished:
            end = len(text) if seq.text_end is None else min(seq.text_end, len(text))
        elif seq.stop_strings:
            end = len(text) - max(map(len, seq.stop_strings)) + 1
        else:
            end = len(text)
        delta = text[self._sent : end] if end > self._sent else ""
        self._sent += len(delta)
        return delta


class GenerationStream:
    """Iterate for text deltas; afterwards ``text``, ``token_ids`` and ``stats`` hold the whole answer.

    The prefill has already run when the stream is created, so ``stats.ttft_s`` is known at once.
    Iterating steps the engine, which also advances the other requests it is running; a stream
    closed or dropped before its end takes its request out of the engine's batch.
    """

    def __init__(self, engine, seq):
        self.stats = seq.stats
        self.prompt_ids = seq.prompt_ids
        self._engine = engine
        self._seq = seq
        self._answer = AnswerText(seq, engine.tokenizer.decode)
        self._closed = False
        # a stream dropped before its end leaves the engine's batch instead of decoding on for nobody
        self._release_request = weakref.finalize(self, engine.abort, seq.request_id)

    @property
    def text(self) -> str:
        """The text handed out so far."""
        return self._answer.text

    @property
    def token_ids(self) -> list[int]:
        return self._answer.token_ids

    @property
    def finish_reason(self) -> str | None:
        return self._seq.finish_reason

    def __iter__(self) -> Iterator[str]:
        seq = self._seq
        while not self._closed:
            finished = seq.finished  # read before pulling: tokens of the last step are pulled with it
            delta = self._answer.pull()
            if delta:
                yield delta
            if finished:
                break
            self._engine.step()
        if seq.error is not None:
            raise seq.error

    def close(self) -> None:
        """Stop generating (the request leaves the engine's batch); the text so far stays."""
        self._closed = True
        self._engine.abort(self._seq.request_id)

    def score(self, continuation: Sequence[int]) -> torch.Tensor:
        """Teacher-forced logits ``[len(continuation), vocab]``: row i predicts ``continuation[i]``.

        Reuses this request's prefilled context (no second prefill): the generated tokens' KV is
        dropped and ``continuation`` runs after the prompt instead. Call it once the stream is
        exhausted (it ends the stream); ``continuation`` may hold up to ``max_new_tokens + 1`` tokens.
        Ids outside the vocabulary are refused before the stream is touched.
        """
        seq = self._seq
        continuation = check_token_ids(continuation, self._engine.model.cfg.vocab_size, "continuation")
        self.close()
        cache = seq.cache
        prompt_len = seq.prompt_slots
        if len(continuation) - 1 > cache.capacity - prompt_len:
            raise FusionRAGError(
                f"cannot score {len(continuation)} tokens: this stream has room for "
                f"{cache.capacity - prompt_len + 1} (max_new_tokens + 1); stream with a larger max_new_tokens"
            )
        cache.valid[prompt_len : cache.length] = False  # forget the generated tokens' KV
        cache.length = prompt_len
        return self._engine.runner.teacher_forced(seq, continuation[:-1])
