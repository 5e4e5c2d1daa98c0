"""Which sequences run in the next step: admissions (prefills) and the running ones (one decode token).

Plain bookkeeping over ``Sequence`` objects, no tensors. Every step decodes all running sequences
and admits waiting ones while the batch has room (``max_num_seqs``), the step's prompt-token
budget lasts and the cache slots the admitted sequences hold stay within ``max_kv_tokens`` (a
sequence holds its prompt plus ``max_new_tokens``, once per answer): past it, requests wait for
running ones to finish instead of failing for memory; a sequence over the prompt-token budget
still runs when nothing else would (the engine refuses one that alone exceeds the slots).
Sequences whose chunk entries were loaded on the background thread (the paper's asynchronous KV
scheduler) are admitted first, oldest first, so a request still loading does not hold up those
behind it; the others are admitted too when there is room, since a bigger batch is worth more than
the short wait for entries already on their way from host memory or disk.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

from fusionrag_llm.engine.sequence import Sequence, Status


def admission_order(waiting: Seq[Sequence], is_ready: Callable[[Sequence], bool]) -> list[Sequence]:
    """Sequences whose entries are loaded first, then the others (which load as they are admitted),
    each group oldest first."""
    ready = {seq.request_id for seq in waiting if is_ready(seq)}  # asked once: loads finish meanwhile
    return [seq for seq in waiting if seq.request_id in ready] + [seq for seq in waiting if seq.request_id not in ready]


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's limits; None: the engine's default for its device (``DEVICE_DEFAULTS``, and on a
    GPU ``max_kv_tokens`` from its free memory: ``engine/model_runner.py``)."""

    max_num_seqs: int | None = None  # sequences decoding together
    max_prefill_tokens: int = 16384  # prompt tokens admitted in one step
    max_kv_tokens: int | None = None  # cache slots the running and admitted sequences hold together

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_prefill_tokens", "max_kv_tokens"):
            value = getattr(self, name)
            if value is None and name != "max_prefill_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                allowed = "an int >= 1" + (" or None (the device's default)" if name != "max_prefill_tokens" else "")
                raise ValueError(f"{name} must be {allowed}, got {value!r}")


# what None means: 16 sequences on a CPU (two cores gain little past 8), 256 on a GPU, as serving engines do
# there; cache slots unbounded on a CPU (host memory), on a GPU a share of its memory (the model runner's)
DEVICE_DEFAULTS = {"cpu": SchedulerConfig(max_num_seqs=16), "cuda": SchedulerConfig(max_num_seqs=256)}


def kv_tokens(seq: Sequence) -> int:
    """The cache slots ``seq`` holds while it runs (its cache's capacity), each of its answers as much."""
    return (seq.num_prompt_tokens + seq.max_new_tokens) * seq.n


@dataclass
class ScheduledStep:
    prefills: list[Sequence] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    """``config``: the limits asked for (``rag.engine.scheduler.config`` may be replaced at any time);
    ``defaults``: what its None fields mean here (``max_kv_tokens`` None there too: no bound)."""

    def __init__(self, config: SchedulerConfig = SchedulerConfig(), defaults: SchedulerConfig = DEVICE_DEFAULTS["cpu"]):
        self.config, self.defaults = config, defaults
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.alone: deque[Sequence] = deque()  # sequences to prefill again, each in a step of its own

    def limit(self, name: str) -> int | None:
        """The limit ``name`` in force: the config's, else the device's default (None: no bound)."""
        value = getattr(self.config, name)
        return getattr(self.defaults, name) if value is None else value

    def retry_alone(self, seq: Sequence) -> None:
        """``seq`` (admitted in the step that just ran) is prefilled again, in a step of its own: no other
        prefill and no decode runs with it (the others wait one step)."""
        self.alone.append(seq)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.alone)

    def to_prefetch(self) -> list[Sequence]:
        """Waiting sequences within their own prefetch window of the queue's head (submitted once)."""
        return [seq for place, seq in enumerate(self.waiting) if place < seq.prefetch]

    def schedule(self, is_ready: Callable[[Sequence], bool]) -> ScheduledStep:
        if self.alone:
            return ScheduledStep(prefills=[self.alone.popleft()])
        step = ScheduledStep(decodes=list(self.running))
        budget = self.config.max_prefill_tokens
        room = self.limit("max_num_seqs") - len(self.running)
        slots = self.limit("max_kv_tokens")
        # each running sequence holds one cache (a request's answers 2..n run as sequences of their own)
        slots = float("inf") if slots is None else slots - sum(seq.num_prompt_tokens + seq.max_new_tokens
                                                                  for seq in self.running)  # fmt: skip
        for seq in admission_order(self.waiting, is_ready):
            # a request of n answers takes n places; one too large for the batch or the budget runs alone
            alone = not (step.prefills or step.decodes)
            if (seq.n > room or seq.num_prompt_tokens > budget or kv_tokens(seq) > slots) and not alone:
                break
            step.prefills.append(seq)
            budget -= seq.num_prompt_tokens
            room -= seq.n
            slots -= kv_tokens(seq)
        for seq in step.prefills:
            self.waiting.remove(seq)
        return step

    def update(self, step: ScheduledStep) -> None:
        """After the step ran: admitted sequences start decoding, finished ones leave."""
        for seq in step.prefills:
            if seq in self.alone:  # to be prefilled again
                continue
            if not seq.finished:
                seq.status = Status.RUNNING
                self.running.append(seq)
            self.running += [fork for fork in seq.forks if not fork.finished]  # its answers 2..n
        self.running = [seq for seq in self.running if not seq.finished]

    def abort(self, request_id: int) -> Sequence | None:
        for queue in (self.waiting, self.running, self.alone):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    return seq
        return None
