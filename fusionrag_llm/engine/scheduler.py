"""Which sequences run in the next step: admissions (prefills) and the running ones (one decode token).

Plain bookkeeping over ``Sequence`` objects, no tensors. Waiting sequences whose chunk entries are
loaded on a background thread (the paper's asynchronous KV scheduler) are admitted when ready: the
oldest ready one first, so a request still loading does not hold up those behind it. When nothing
is running and nothing is ready, the oldest waiting one is admitted and the engine waits for its
entries. Admissions are bounded by a number of sequences and of prompt tokens per step; at least one
is always admitted when nothing else would run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

from fusionrag_llm.engine.sequence import Sequence, Status


def pick_next(queued: Seq[int], is_ready: Callable[[int], bool]) -> tuple[int, bool]:
    """(request id to run next, whether it is ready): the oldest ready one, else the oldest."""
    for request_id in queued:
        if is_ready(request_id):
            return request_id, True
    return queued[0], False


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16  # sequences decoding together
    max_prefill_tokens: int = 16384  # prompt tokens admitted in one step
    lookahead: int = 4  # waiting sequences considered for admission (the oldest ready one first)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_prefill_tokens", "lookahead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass
class ScheduledStep:
    prefills: list[Sequence] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, config: SchedulerConfig = SchedulerConfig()):
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def to_prefetch(self) -> list[Sequence]:
        """Waiting sequences within their own prefetch window of the queue's head (submitted once)."""
        return [seq for place, seq in enumerate(self.waiting) if place < seq.prefetch]

    def schedule(self, is_ready: Callable[[Sequence], bool]) -> ScheduledStep:
        step = ScheduledStep(decodes=list(self.running))
        budget = self.config.max_prefill_tokens
        while self.waiting and len(self.running) + len(step.prefills) < self.config.max_num_seqs:
            window = list(self.waiting)[: self.config.lookahead]
            index, ready = pick_next(range(len(window)), lambda i: is_ready(window[i]))
            seq = window[index]
            must_run = not step.decodes and not step.prefills
            if not must_run and (not ready or seq.num_prompt_tokens > budget):
                break
            self.waiting.remove(seq)
            step.prefills.append(seq)
            budget -= seq.num_prompt_tokens
        return step

    def update(self, step: ScheduledStep) -> None:
        """After the step ran: admitted sequences start decoding, finished ones leave."""
        for seq in step.prefills:
            if not seq.finished:
                seq.status = Status.RUNNING
                self.running.append(seq)
        self.running = [seq for seq in self.running if not seq.finished]

    def abort(self, request_id: int) -> Sequence | None:
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    return seq
        return None
