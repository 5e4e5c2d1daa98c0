"""One request's state as it moves through the engine: waiting, running (decoding), finished.

Plain bookkeeping: the scheduler moves sequences between queues by these fields and never touches
their tensors. The device state (the request's KV cache and the logits after its prompt) is held
here for the model runner and for scoring after generation.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from fusionrag_llm.methods.base import RunPlan
from fusionrag_llm.engine.sampling import GREEDY, SamplingParams
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.request import Segment


class Status(enum.Enum):
    WAITING = "waiting"  # queued; its entries may be loading in the background
    RUNNING = "running"  # prefilled; one token per step
    FINISHED = "finished"


FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(eq=False)
class Sequence:
    request_id: int
    segments: list[Segment]
    plan: RunPlan
    max_new_tokens: int
    prompt_ids: list[int]
    stop_ids: frozenset[int]
    sampling: SamplingParams = GREEDY
    generator: Any = None  # its torch.Generator when it samples (SamplingParams.generator)
    constraint: Any = None  # its JSONConstraint when it asked for JSON (``engine/structured.py``)
    n: int = 1  # answers to the same prompt: the others fork from this one after its prefill
    forks: list["Sequence"] = field(default_factory=list)  # those other answers, once forked
    stop_strings: tuple[str, ...] = ()
    prefetch: bool = False  # load its entries on the loader thread while others compute
    preloaded: dict | None = None  # key -> (entry, tier) the caller fetched already
    status: Status = Status.WAITING
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: BaseException | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float = 0.0
    context_plan: Any = None  # the tensor-free ContextPlan: every key its context may read
    text_end: int | None = None  # where the returned text ends: the start of the stop string found
    searched: int = 0  # characters of the text already searched for stop strings
    answer_text: Any = None  # its answer decoded token by token (streaming.IncrementalText), for stop strings
    cache: Any = None  # the request's KVCache, owned by the model runner's allocations
    prompt_logits: Any = None  # [vocab] logits after the last prompt token
    prompt_end: int | None = None  # the position after the prompt's last one (set once assembled)
    prompt_slots: int = 0  # cache slots the prompt holds after its prefill (fewer after decode KV eviction)
    method_run: Any = None  # its method's state (``MethodRun``), from its prefill on
    # whose KV its context holds (models/prefix_cache.py): before its prefill None, or the namespace of an
    # approximated earlier turn it starts from; after it "exact" or its own plan's namespace
    kv_namespace: str | None = None
    tenant: str = ""  # whose entries and turn KV it reads and writes ("": the default tenant)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def next_position(self) -> int:
        """Position of the last generated token, the one the next decode step feeds."""
        end = self.num_prompt_tokens if self.prompt_end is None else self.prompt_end
        return end + len(self.token_ids) - 1

    def accept(self, token: int) -> None:
        """Take the next token; finish on a stop token (not kept) or at ``max_new_tokens``."""
        if self.finished:  # aborted while its step ran
            return
        if token in self.stop_ids:
            self.finish("stop")
            return
        self.token_ids.append(token)
        if len(self.token_ids) >= self.max_new_tokens:
            self.finish("length")

    def find_stop_string(self, text: str) -> None:
        """Finish at the first stop string in ``text`` (the answer so far); only new text is searched. The
        last allowed token may complete one: the answer then ends before it too, as stopped, not cut."""
        longest = max(map(len, self.stop_strings))
        start = max(0, self.searched - longest + 1)
        found = [i for i in (text.find(stop, start) for stop in self.stop_strings) if i >= 0]
        self.searched = len(text)
        if found and (not self.finished or self.finish_reason == "length"):
            self.text_end = min(found)
            self.finish("stop")

    def finish(self, reason: str, error: BaseException | None = None) -> None:
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, error
        self.stats.generated_tokens = len(self.token_ids)
        if self.first_token_at:
            self.stats.decode_s = time.perf_counter() - self.first_token_at
