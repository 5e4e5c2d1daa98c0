"""The engine: requests in, one scheduling step at a time, tokens out.

``add_request`` queues a sequence; ``step`` admits what fits (resolve and assemble its context,
select the tokens to recompute), then runs the admitted sequences' sparse prefills and one decode
token of every running sequence in one batched forward. ``generate``, ``stream`` and
``generate_many`` are loops over ``step``, so concurrent callers share its batches.

Prompt tokens occupy slots equal to their positions; the prefix comes from the exact prefix cache,
chunks from their entries (rotary applied at their assembled positions), and the recompute set
(selected chunk tokens plus all fresh text) is run through every layer, replacing the reused K/V of
its positions layer by layer in the request's own cache. Shared entries are only read.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence as Seq

import torch

from fusionrag_llm.engine.decode import check_token_ids
from fusionrag_llm.engine.model_runner import ModelRunner
from fusionrag_llm.engine.connector import KVConnector
from fusionrag_llm.engine.resolve import ContextResolver, Preloaded, ResolvedContext
from fusionrag_llm.engine.sampling import SamplingParams
from fusionrag_llm.engine.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from fusionrag_llm.engine.sequence import Sequence, Status
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.engine.streaming import GenerationStream, IncrementalText
from fusionrag_llm.engine.structured import json_constraint
from fusionrag_llm.engine.tenants import TenantScopes
from fusionrag_llm.errors import FusionRAGError, PromptTooLongError
from fusionrag_llm.fusion.entry_compute import PREFIX_MEMO_BYTES
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.fusion.request_variants import check_craft_variants
from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.fusion.scorers.auxiliary_attention import check_layers
from fusionrag_llm.methods.base import MethodRun, Prefill, RunPlan, select_many
from fusionrag_llm.models.llama import ForwardOutput, ForwardPass
from fusionrag_llm.models.loader import LoadedModel, check_auxiliary_model
from fusionrag_llm.models.prefix_cache import PrefixCache
from fusionrag_llm.request import Segment, prompt_ids

__all__ = ["Generation", "LLMEngine", "SchedulerConfig"]


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]  # exactly the ids the model saw
    stats: GenerationStats
    segments: list[Segment] = field(default_factory=list, repr=False)
    finish_reason: str | None = None  # "stop" (a stop token), "length" (max_new_tokens) or "abort"
    others: list["Generation"] = field(default_factory=list, repr=False)  # answers 2..n when n > 1


@dataclass
class PrefillWork:
    """A sequence admitted in this step: its assembled context, then its sparse-prefill pass and
    what to do with its output (``forward`` and what follows are set once its tokens are chosen)."""

    seq: Sequence
    resolver: ContextResolver
    resolved: ResolvedContext
    k: int  # reused tokens to recompute
    started: float
    forward: ForwardPass | None = None
    recompute: torch.Tensor | None = None  # sorted slots run through the model
    exact: bool = False  # every context token is exact after this pass (its path blocks can be stored)
    chosen: float = 0.0
    prefill: Prefill | None = None  # what the method's run sees
    run: MethodRun | None = None  # the method's state for this request (its hooks, its work after)


class LLMEngine:
    def __init__(self, loaded: LoadedModel, entry_store: EntryStore, prefix_cache: bool = True,
                 config: SchedulerConfig = SchedulerConfig(), auxiliary: int | LoadedModel | None = None,
                 turns: PrefixCache | None = None, craft_variants: int = 0,
                 layerwise_load: bool | None = None, reproducible: bool = False):  # fmt: skip
        self.loaded = loaded
        # a request whose plan leaves it open (None) runs reproducibly when this is True (``RunPlan``)
        self.reproducible = reproducible
        # CacheClip's auxiliary model: a separate one of the same tokenizer, or the first
        # ``auxiliary_layers`` layers of this one
        self.auxiliary_model = check_auxiliary_model(auxiliary, loaded) if isinstance(auxiliary, LoadedModel) else None
        self.auxiliary_layers = None if self.auxiliary_model is not None else check_layers(auxiliary, loaded.model.cfg.num_layers)
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        # this model's entries in the store, each read checked, per tenant (``engine/tenants.py``)
        # a lossy store's exact prompt prefixes: in the turn cache's blocks if there is one, beside turn KV,
        # else in blocks of their own (memory taken when first used)
        prefixes = turns if turns is not None else PrefixCache(PREFIX_MEMO_BYTES)
        self.tenants = TenantScopes(loaded.model, entry_store, check_craft_variants(craft_variants), prefixes)
        self.entry_store = entry_store  # the default tenant's
        self.keys = entry_store.keys
        self.computer = self.tenants.default.computer  # makes the entries a request misses
        self.prefix_cache = prefix_cache
        self.runner = ModelRunner(loaded.model)
        self.scheduler = Scheduler(config, self.runner.defaults)
        # Cache-Craft's layer-wise preloading (``fusion/layer_feed.py``): stored KV reaches the request
        # cache layer by layer while the forward runs; default on for a CUDA model, where a copy engine
        # overlaps it with compute (on the CPU nothing would overlap)
        layerwise = loaded.model.device.type == "cuda" if layerwise_load is None else bool(layerwise_load)
        # every load and save of KV beside the forward: the loader thread, layer-wise feeds, turn KV, path blocks
        self.kv = KVConnector(entry_store.store, self.runner, turns, self.keys.exact_blocks, layerwise)
        # Cache-Craft's request-made chunk variants, M per chunk on average (None: not kept or read)
        self.variants = self.tenants.default.variants
        self._lock = threading.RLock()  # one step at a time; callers on other threads join its batches
        self._request_ids = itertools.count()

    @property
    def lock(self) -> threading.RLock:
        """Held by every step; hold it too for work that must not interleave with one (ingestion)."""
        return self._lock

    def resolver(self, preloaded: Preloaded | None = None, pinned=(), tenant: str = "",
                 reproducible: bool = False) -> ContextResolver:  # fmt: skip
        """What reads and places a request's context, with ``tenant``'s keys (default: the default tenant);
        ``reproducible``: no path block after the prompt's prefix, no Cache-Craft variant of a request."""
        scope = self.tenants[tenant]
        return ContextResolver(scope.computer, preloaded, self.prefix_cache and not reproducible, pinned,
                               None if reproducible else scope.variants)  # fmt: skip

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int, n: int = 1) -> None:
        """Refuse a request the model's context window or the scheduler's cache slots cannot hold."""
        window = self.loaded.context_window
        if num_prompt_tokens + max_new_tokens > window:
            raise PromptTooLongError(
                f"the prompt has {num_prompt_tokens} tokens and {max_new_tokens} new tokens were asked for, "
                f"but model {self.loaded.name!r} has a context window of {window} tokens; "
                "pass fewer or shorter chunks, or lower max_new_tokens"
            )
        slots, need = self.scheduler.limit("max_kv_tokens"), (num_prompt_tokens + max_new_tokens) * n
        if slots is not None and need > slots:
            answers = f" for each of {n} answers" if n > 1 else ""
            raise PromptTooLongError(
                f"the request needs {need} cache slots ({num_prompt_tokens} prompt tokens plus max_new_tokens="
                f"{max_new_tokens}{answers}), but the engine's requests may hold {slots} together "
                "(SchedulerConfig.max_kv_tokens); pass fewer or shorter chunks, lower max_new_tokens or n, "
                "or raise max_kv_tokens"
            )

    # ------------------------------------------------------------------ the step API
    def add_request(self, segments: Seq[Segment], plan: RunPlan, max_new_tokens: int, *, stop: Seq[str] = (),
                    prefetch: int = 0, sampling: SamplingParams | dict | None = None, n: int = 1, tenant: str | None = None) -> Sequence:  # fmt: skip
        """Queue a request; returns its sequence (``request_id``, ``token_ids``, ``finished``, ``stats``).

        ``stop``: strings that end decoding once the answer contains one (the answer is cut before
        it). ``prefetch``: load its chunk entries on the loader thread once it is within this many
        places of the head of the queue (0: load them when it is admitted). ``sampling``: how tokens
        are chosen (``SamplingParams`` or a dict of its fields; default greedy). ``n``: answers to
        draw; answers 2..n fork from the first after its prefill (``seq.forks``), so the prompt is
        computed once. ``tenant``: whose entries, exact KV and turn KV it reads and writes (None: the
        default tenant's; ``engine/tenants.py``).
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise FusionRAGError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise FusionRAGError(f"n must be an int in [1, {MAX_N}], got {n!r}")
        sampling = SamplingParams.of(sampling)
        extra_stops = check_token_ids(sampling.stop_token_ids, self.model.cfg.vocab_size, "stop_token_ids")
        scope = self.tenants[tenant]
        plan = self._settled(plan)
        seq = self._sequence(segments, plan, max_new_tokens, scope.tenant, n)
        seq.stop_strings, seq.prefetch = check_stop(stop), prefetch
        seq.sampling, seq.n = sampling, n
        seq.generator = sampling.generator(self.model.device)
        if sampling.json_schema is not None:
            seq.constraint = json_constraint(self.tokenizer, self.model.cfg.vocab_size, sampling.json_schema)
        seq.stop_ids = frozenset(extra_stops) | (frozenset() if sampling.ignore_eos else seq.stop_ids)
        self.kv.match_turn(seq, scope)
        seq.context_plan = self.resolver(tenant=scope.tenant, reproducible=plan.reproducible).plan(
            seq.segments, plan)  # keys once, for prefetch and assembly
        with self._lock:
            self.scheduler.add(seq)
        return seq

    def step(self) -> list[Sequence]:
        """Admit, prefill and decode once; returns the sequences that finished in this step."""
        with self._lock:
            self.kv.start_load(self.scheduler.to_prefetch())
            scheduled = self.scheduler.schedule(self.kv.loaded)
            if scheduled.empty:
                return []
            # admitted ones still to load start now, behind the assembly of those admitted before them
            self.kv.start_load([seq for seq in scheduled.prefills if seq.prefetch])
            self._run(scheduled)
            self.scheduler.update(scheduled)
            self.kv.release_if_idle(self.scheduler.waiting)
            return [seq for seq in [*scheduled.prefills, *scheduled.decodes] if seq.finished]

    def _settled(self, plan: RunPlan) -> RunPlan:
        """``plan`` with ``reproducible`` decided: the engine's setting where the request left it open."""
        return plan if plan.reproducible is not None else dataclasses.replace(plan, reproducible=self.reproducible)

    def abort(self, request_id: int) -> bool:
        """Stop a waiting or running request (and its forks); it finishes with reason ``"abort"``."""
        with self._lock:
            seq = self.scheduler.abort(request_id)
            if seq is None:
                return False
            self.kv.discard(seq)
            for one in [seq, *seq.forks]:
                if not one.finished:
                    self.scheduler.abort(one.request_id)
                    one.finish("abort")
            return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def _run(self, scheduled: ScheduledStep) -> None:
        work = self._admit(scheduled.prefills)
        decodes = scheduled.decodes
        passes = [w.forward for w in work] + self.runner.decode_passes(decodes)
        caches = [w.seq.cache for w in work] + [seq.cache for seq in decodes]
        if not passes:
            return
        outputs = self._forward(passes, caches)
        for seq, out in zip([w.seq for w in work] + decodes, outputs):
            if isinstance(out, _Retry):  # its hooks ran in a batch that failed: it starts over, alone
                self._start_over(seq)
            elif isinstance(out, Exception):  # its own forward failed: it fails alone
                seq.finish("error", out)
        work = [w for w, out in zip(work, outputs) if not isinstance(out, Exception)]
        decodes = [seq for seq, out in zip(decodes, outputs[len(passes) - len(decodes) :]) if not isinstance(out, Exception)]
        outputs = [out for out in outputs if not isinstance(out, Exception)]
        try:
            for w, out in zip(work, outputs):
                self._finish_prefill(w, out)
            firsts = [seq for w in work for seq in (w.seq, *w.seq.forks)]  # forks share their prompt's logits
            logits = [seq.prompt_logits for seq in firsts] + [out.logits[-1] for out in outputs[len(work) :]]
            tokens = self.runner.next_tokens(logits, firsts + decodes)
        except Exception as exc:  # the batch's sequences fail together; their callers raise it
            for seq in [one for w in work for one in (w.seq, *w.seq.forks)] + decodes:
                seq.finish("error", exc)
            return
        for seq, token in zip(firsts + decodes, tokens):
            try:
                if isinstance(token, Exception):
                    raise token
                seq.accept(token)
                if seq.stop_strings and seq.token_ids:
                    seq.find_stop_string(self._answer_so_far(seq))
                if seq.finished:
                    self.kv.save_turn(seq)
            except Exception as exc:  # its draw, stop search or turn keeping: this sequence fails alone
                seq.finish("error", exc)

    def _forward(self, passes: list[ForwardPass], caches: list) -> list:
        """The step's batched forward; when it raises, each pass runs alone, so a sequence whose own forward
        fails (an exception in its place) fails alone. A pass with method hooks is not run again on its
        cache (a hook may have changed the cache or its state already): its sequence starts over from
        its assembly in a step of its own (``_Retry``), so it fails only if it fails alone."""
        try:
            return self.runner.run(passes, caches)
        except Exception as exc:
            if len(passes) == 1:
                return [exc]
            return [_Retry(exc) if step.hooks else self._alone(step, cache) for step, cache in zip(passes, caches)]

    def _start_over(self, seq: Sequence) -> None:
        """Put a sequence whose prefill ran in a failed batch back at the head of the queue, with nothing
        of that prefill kept: it is assembled, selected and prefilled again, alone in its step."""
        stats = seq.stats
        seq.stats = GenerationStats(method=stats.method, recompute_ratio=stats.recompute_ratio,
                                    prompt_tokens=stats.prompt_tokens, turn_tokens=stats.turn_tokens)  # fmt: skip
        seq.cache = seq.method_run = seq.prompt_end = None
        self.scheduler.retry_alone(seq)

    def _alone(self, step: ForwardPass, cache):
        try:
            return self.runner.run([step], [cache])[0]
        except Exception as exc:
            return exc

    # ------------------------------------------------------------------ one sequence's prefill
    def _sequence(self, segments: Seq[Segment], plan: RunPlan, max_new_tokens: int, tenant: str = "",
                  n: int = 1) -> Sequence:  # fmt: skip
        ids = prompt_ids(segments)
        self.check_fits(len(ids), max_new_tokens, n)
        stats = GenerationStats(method=plan.name, recompute_ratio=plan.recompute_ratio, prompt_tokens=len(ids))
        return Sequence(next(self._request_ids), list(segments), plan, max_new_tokens, ids,
                        self.tokenizer.stop_ids, stats=stats, tenant=tenant)  # fmt: skip

    def _admit(self, seqs: Seq[Sequence]) -> list[PrefillWork]:
        """Assemble each admitted sequence's context, choose the tokens to recompute for all of them
        at once (scoring forwards batched), then build their sparse-prefill passes."""
        work = [w for w in map(self._assemble, seqs) if w is not None]
        if not work:
            return []
        started = time.perf_counter()
        jobs = [(w.seq.plan.method, w.k, ScoringInput(self.model, w.seq.cache, w.resolved.layout, self.auxiliary_layers,
                                                      w.k, self.auxiliary_model))
                for w in work]  # fmt: skip
        picks = select_many(jobs, self.model)
        chosen = time.perf_counter()
        ready = []
        for w, selected in zip(work, picks):
            if isinstance(selected, Exception):  # a failed selection fails its sequences only
                w.seq.finish("error", selected)
                continue
            w.seq.stats.select_s, w.chosen = chosen - started, chosen
            self._plan_prefill(w, selected)
            ready.append(w)
        return ready

    def _assemble(self, seq: Sequence) -> PrefillWork | None:
        start = time.perf_counter()
        stats, plan = seq.stats, seq.plan
        stats.queue_s = start - seq.arrival
        resolver = None
        try:
            preloaded, pinned = self.kv.take(seq)
            resolver = self.resolver(preloaded, pinned, seq.tenant, bool(plan.reproducible))
            seq.cache = self.runner.new_cache(seq.num_prompt_tokens + seq.max_new_tokens,
                                              self.scheduler.limit("max_kv_tokens"))  # fmt: skip
            if seq.context_plan is None:
                seq.context_plan = resolver.plan(seq.segments, plan)
            resolved, counts = resolver.assemble_plan(seq.context_plan, seq.cache, self.kv.feed(seq.cache))
            seq.prompt_end = seq.context_plan.prompt_end  # from the plan: no read of the device
        except Exception as exc:  # a bad store entry or input fails this request only
            seq.finish("error", exc)
            return None
        finally:
            if resolver is not None:
                resolver.release()  # the KV is in the request's cache (or the request failed)
        counts.merge_into(stats)
        stats.load_s = time.perf_counter() - start
        k = round(plan.recompute_ratio * len(resolved.layout.reused_slots))
        return PrefillWork(seq, resolver, resolved, k, start)

    def _plan_prefill(self, work: PrefillWork, selected: torch.Tensor) -> None:
        stats, layout = work.seq.stats, work.resolved.layout
        work.recompute = torch.cat([selected, layout.fresh_slots]).sort().values
        if not len(work.recompute):  # a prompt served whole from exact KV (a raw prompt ending in its
            # cached prefix): its last token runs again, rewriting its own KV, for the next token's logits
            work.recompute = torch.tensor([len(layout.token_ids) - 1], device=selected.device)
        # exact: every context token's KV is exact after this pass (not when its prefix came approximated
        # from an earlier turn: then its path blocks are not stored either)
        work.exact = len(selected) == len(layout.reused_slots) and work.seq.kv_namespace is None
        _count_tokens(stats, layout, selected)
        stats.computed_tokens += len(work.recompute)
        work.prefill = Prefill(self.model, layout, work.seq.cache, work.recompute, selected, work.exact,
                               stats.method_stats, work.resolver, work.resolved)  # fmt: skip
        work.run = work.seq.method_run = work.seq.plan.method.start(work.prefill)
        work.forward = self.runner.recompute_pass(layout, work.recompute, capture_raw_kv=work.exact,
                                                  hooks=tuple(work.run.hooks), scaling=work.run.scaling,
                                                  exact=work.exact)  # fmt: skip

    def _finish_prefill(self, work: PrefillWork, out: ForwardOutput) -> None:
        seq = work.seq
        seq.cache.settle()  # the prefill read every layer: what is left of the layer feed is bookkeeping
        self.kv.save_prefill(seq, work.resolver, work.resolved, work.recompute, out, work.exact)
        done = time.perf_counter()
        seq.stats.prefill_s, seq.stats.ttft_s = done - work.chosen, done - work.started
        seq.prompt_logits, seq.first_token_at = out.logits[-1], done
        kept = work.run.after_prefill(work.prefill)  # e.g. write-back, decode KV eviction
        seq.cache = seq.cache if kept is None else self.runner.pooled(kept)
        seq.prompt_slots = seq.cache.length
        seq.forks = [self._fork(seq, index) for index in range(1, seq.n)]

    def _answer_so_far(self, seq: Sequence) -> str:
        """``seq``'s answer text, extended by decoding only its new tokens (never the whole answer again)."""
        if seq.answer_text is None:
            seq.answer_text = IncrementalText(self.tokenizer.decode)
        return seq.answer_text.follow(seq.token_ids)

    def _fork(self, seq: Sequence, index: int) -> Sequence:
        """Answer ``index`` of ``seq``'s ``n``: its prompt's KV copied, its own random stream."""
        twin = Sequence(next(self._request_ids), seq.segments, seq.plan, seq.max_new_tokens, seq.prompt_ids,
                        seq.stop_ids, sampling=seq.sampling, stop_strings=seq.stop_strings, status=Status.RUNNING,
                        stats=copy.deepcopy(seq.stats), arrival=seq.arrival, first_token_at=seq.first_token_at,
                        cache=self.runner.fork_cache(seq.cache), prompt_logits=seq.prompt_logits, prompt_end=seq.prompt_end,
                        prompt_slots=seq.prompt_slots, kv_namespace=seq.kv_namespace,
                        method_run=seq.method_run, tenant=seq.tenant)  # fmt: skip
        twin.generator = seq.sampling.generator(self.model.device, offset=index)
        twin.constraint = None if seq.constraint is None else seq.constraint.fresh()
        return twin

    # ------------------------------------------------------------------ loops over step
    def run_until_finished(self, seqs: Seq[Sequence]) -> None:
        """Step until every one of ``seqs`` (and their forks) has finished; re-raise the first one's error."""
        while not all(one.finished for seq in seqs for one in (seq, *seq.forks)):
            self.step()
        for seq in seqs:
            if seq.error is not None:
                raise seq.error

    def generate(self, segments: Seq[Segment], plan: RunPlan, max_new_tokens: int, stop: Seq[str] = (),
                 sampling=None, n: int = 1, tenant: str | None = None) -> Generation:  # fmt: skip
        seq = self.add_request(segments, plan, max_new_tokens, stop=stop, sampling=sampling, n=n, tenant=tenant)
        self.run_until_finished([seq])
        return self.generation(seq)

    def generate_many(self, requests: Seq[tuple], lookahead: int = 4, stop: Seq[str] = (),
                      sampling=None) -> list[Generation]:  # fmt: skip
        """Run ``(segments, plan, max_new_tokens)`` requests (or ``(..., tenant)``) as one batch, in
        order of the results.

        Every request is checked before any is queued; entries of the next ``lookahead`` waiting
        requests load on a background thread while the engine computes.
        """
        checked = [(list(segments), plan, max_new, self.tenants[tenant[0] if tenant else None].tenant)
                   for segments, plan, max_new, *tenant in requests]  # fmt: skip
        for segments, _, max_new, _ in checked:
            self.check_fits(len(prompt_ids(segments)), max_new)
        seqs = [self.add_request(segments, plan, max_new, stop=stop, prefetch=lookahead, sampling=sampling, tenant=tenant)
                for segments, plan, max_new, tenant in checked]  # fmt: skip
        self.run_until_finished(seqs)
        return [self.generation(seq) for seq in seqs]

    def stream(self, segments: Seq[Segment], plan: RunPlan, max_new_tokens: int, stop: Seq[str] = (),
               sampling=None, tenant: str | None = None) -> GenerationStream:  # fmt: skip
        """Prefill now; iterate the returned stream for text deltas."""
        seq = self.add_request(segments, plan, max_new_tokens, stop=stop, sampling=sampling, tenant=tenant)
        while seq.status is Status.WAITING:
            self.step()
        if seq.error is not None:
            raise seq.error
        return GenerationStream(self, seq)

    def generation(self, seq: Sequence) -> Generation:
        return Generation(text=self.tokenizer.decode(seq.token_ids)[: seq.text_end], token_ids=list(seq.token_ids),
                          prompt_ids=seq.prompt_ids, stats=seq.stats, segments=seq.segments,
                          finish_reason=seq.finish_reason, others=[self.generation(fork) for fork in seq.forks])  # fmt: skip

    def logits(self, segments: Seq[Segment], continuation: Seq[int], plan: RunPlan,
               tenant: str | None = None) -> torch.Tensor:  # fmt: skip
        """[len(continuation) + 1, vocab] teacher-forced logits after the prompt and each continuation token."""
        continuation = check_token_ids(continuation, self.model.cfg.vocab_size)
        seq = self._sequence(segments, self._settled(plan), len(continuation), self.tenants[tenant].tenant)
        with self._lock:
            work = self._admit([seq])
            if not work:
                raise seq.error
            self._finish_prefill(work[0], self.runner.run([work[0].forward], [seq.cache])[0])
        return self.runner.teacher_forced(seq, continuation)


class _Retry(Exception):
    """In place of the output of a pass with method hooks whose batch failed: its sequence starts over."""


def _count_tokens(stats: GenerationStats, layout, selected: torch.Tensor) -> None:
    """Split the prompt's tokens by where their KV came from, each token counted once."""
    missed = layout.missed_slots if layout.missed_slots is not None else selected[:0]
    missed_kept = int((~torch.isin(missed, selected)).sum()) if len(missed) else 0  # no read without a miss
    stats.recomputed_tokens, stats.missed_tokens = len(selected), missed_kept
    stats.reused_tokens = len(layout.reused_slots) - len(selected) - missed_kept
    stats.fresh_tokens = len(layout.fresh_slots)
    stats.exact_tokens = stats.prompt_tokens - len(layout.reused_slots) - len(layout.fresh_slots)


MAX_STOP_STRINGS = 16
MAX_N = 16  # answers per request


def check_stop(stop) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (one string alone is one stop string)."""
    stop = (stop,) if isinstance(stop, str) else stop
    if stop is None:
        return ()
    if not hasattr(stop, "__iter__") or isinstance(stop, (bytes, dict)):
        raise FusionRAGError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stop = tuple(stop)
    if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        raise FusionRAGError(f"stop must hold at most {MAX_STOP_STRINGS} non-empty strings, got {stop!r:.80}")
    return stop
