"""The quality benchmark: task quality and fidelity to Full Attention per method and recompute ratio.

Per question: the Full Attention greedy answer is the reference, and its teacher-forced logits the
reference distribution. Each (method, ratio) then answers greedily (F1/EM against the gold answers,
first-token agreement and greedy exact match against the reference answer, TTFT) and is teacher
forced on the reference answer (mean KL(FA || method) over the rows that predict its tokens; the
first row alone when the reference answer is empty), reusing the prefill that produced its answer.
Full Attention's record also carries its ``margins`` (top-1 minus top-2 probability at each answer token: how near each
of its greedy choices was to a tie), every other method's its ``parting_gap`` (where its greedy
answer parts from Full Attention's, its probability of its own token minus that of theirs).
Records go to a :class:`PartialLog` as they are made, so a re-run with the same configuration
skips them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tqdm.auto import tqdm

from fusionrag_llm.eval.bench_data import add_chunks, chunk_texts, jobs
from fusionrag_llm.eval.datasets import QAExample
from fusionrag_llm.eval.metrics import (choice_gap, exact_match, f1_score, first_token_agreement, greedy_exact_match,
                                        mean_kl, parting_position, top_margins)
from fusionrag_llm.eval.partial_log import PartialLog
from fusionrag_llm.eval.results import check_ints
from fusionrag_llm.request import RAGRequest

STAT_FIELDS = ("ttft_s", "load_s", "select_s", "prefill_s", "decode_s", "prompt_tokens", "reused_tokens",
               "recomputed_tokens", "missed_tokens", "computed_tokens", "generated_tokens", "path_hits", "tier_hits",
               "variant_hits")  # fmt: skip


@dataclass(frozen=True)
class QualityConfig:
    """Settings of one quality run; ``identity()`` are those that change a record's value."""

    dataset: str  # "synthetic" or a resolved file path
    model: str
    methods: tuple[str, ...]
    ratios: tuple[float, ...]
    passages: int = 10
    limit: int | None = None
    neighbors: int = 10
    max_new_tokens: int = 32
    seed: int = 0  # synthetic data only
    words_per_passage: int = 60  # synthetic only
    device: str | None = None
    dtype: str | None = None
    skip: int = 0  # questions dropped before the first ``limit``
    kv_codec: str = "model"  # how the store keeps chunk KV; "model": the compute dtype (checked by the engine)

    def __post_init__(self) -> None:
        check_ints(self, ("passages", "max_new_tokens", "words_per_passage"))
        check_ints(self, ("neighbors", "skip"), minimum=0)
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or None for all questions), got {self.limit!r}")
        if not self.methods or not self.ratios:
            raise ValueError("at least one method and one ratio are needed")

    def identity(self) -> dict:
        """Everything but methods and ratios: records stay valid when those are extended."""
        data = self.to_dict()
        del data["methods"], data["ratios"]
        if not data["skip"]:
            del data["skip"]  # logs written before skip existed stay resumable
        if data["kv_codec"] == "model":
            del data["kv_codec"]  # likewise for logs written before codecs existed
        return data

    def to_dict(self) -> dict:
        data = asdict(self)
        data["methods"] = list(self.methods)
        data["ratios"] = list(self.ratios)
        return data


@dataclass
class QualityRun:
    """What one invocation did: the offline stage and how many records it computed or skipped."""

    offline: dict = field(default_factory=dict)
    computed: int = 0
    skipped: int = 0


def run_quality(rag, examples: list[QAExample], config: QualityConfig, log: PartialLog,
                progress: bool = True) -> QualityRun:  # fmt: skip
    """Fill ``log`` with a record per (question, method, ratio) of ``config``; return what was done."""
    todo = {ex.id: [j for j in jobs(config.methods, config.ratios) if not log.has((ex.id, *j))] for ex in examples}
    run = QualityRun(skipped=sum(len(jobs(config.methods, config.ratios)) - len(t) for t in todo.values()))
    pending = [ex for ex in examples if todo[ex.id]]
    if not pending:
        return run  # everything was resumed: no offline stage needed
    # plain and fused entries of every passage of the run; neighbours come from that whole pool
    pool = [text for ex in examples for text in chunk_texts(ex)]
    run.offline = add_chunks(rag, pool, config.neighbors, config.methods, progress)
    _warm_up(rag, pending[0])
    for ex in tqdm(pending, desc="questions", unit="q", disable=not progress):
        # Entries evicted from a bounded store since the offline stage are recomputed here (same
        # neighbours: the catalog holds the whole pool), so no method silently falls back to plain.
        add_chunks(rag, chunk_texts(ex), config.neighbors, config.methods)
        run.computed += _run_question(rag, ex, todo[ex.id], config, log)
    return run


def records_of_run(log: PartialLog, examples: list[QAExample], config: QualityConfig) -> list[dict]:
    """The log's records for this run's questions, methods and ratios (a log may hold more)."""
    keys = [(ex.id, method, ratio) for ex in examples for method, ratio in jobs(config.methods, config.ratios)]
    return [log.get(key) for key in keys if log.has(key)]


def _request(ex: QAExample) -> RAGRequest:
    return RAGRequest(chunks=chunk_texts(ex), question=ex.question)


def _warm_up(rag, ex: QAExample) -> None:
    """One untimed answer so the first timed request does not pay one-off setup costs."""
    rag.generate(_request(ex), method="full_attention", recompute_ratio=1.0, max_new_tokens=1)


def _run_question(rag, ex: QAExample, todo: list, config: QualityConfig, log: PartialLog) -> int:
    request = _request(ex)
    fa = config.methods[0]  # parse_methods puts full_attention first
    done_fa = log.get((ex.id, fa, None))
    out = _answer(rag, request, fa, None, config)
    ref_ids = list(out.token_ids) if done_fa is None else done_fa["token_ids"]
    ref_logits = out.score(ref_ids)
    computed = 0
    for method, ratio in todo:
        if method == fa:
            record = _record(ex, method, ratio, out, ref_ids, kl=0.0)
            record["margins"] = [round(m, 5) for m in top_margins(ref_logits)]
        else:
            gen = _answer(rag, request, method, ratio, config)
            logits = gen.score(ref_ids)
            record = _record(ex, method, ratio, gen, ref_ids, kl=mean_kl(ref_logits, logits))
            record["parting_gap"] = _parting_gap(logits, ref_ids, list(gen.token_ids))
        log.append(record)
        computed += 1
    return computed


def _parting_gap(logits, ref_ids: list[int], ids: list[int]) -> float | None:
    """How much the method preferred its own token to Full Attention's where its greedy answer parts
    from it (its probability minus theirs, on the same prefix); None when the answers agree or one
    ends there."""
    at = parting_position(ref_ids, ids)
    if at is None or at >= min(len(ref_ids), len(ids)):
        return None
    return round(choice_gap(logits[at], ids[at], ref_ids[at]), 5)


def _answer(rag, request, method: str, ratio, config: QualityConfig):
    """The greedy answer as an exhausted stream, whose prefilled context can still be scored."""
    stream = rag.stream(request, method=method, recompute_ratio=ratio,
                        max_new_tokens=config.max_new_tokens)  # fmt: skip
    for _ in stream:
        pass
    return stream


def _record(ex: QAExample, method: str, ratio, gen, ref_ids: list[int], kl: float) -> dict:
    stats = gen.stats.to_dict()
    return {
        "qid": ex.id,
        "method": method,
        "ratio": ratio,
        "answer": gen.text,
        "token_ids": list(gen.token_ids),
        "golds": list(ex.answers),
        "f1": f1_score(gen.text, ex.answers),
        "em": exact_match(gen.text, ex.answers),
        "first_token": first_token_agreement(ref_ids, gen.token_ids),
        "greedy_em": greedy_exact_match(ref_ids, gen.token_ids),
        "kl": kl,
        **{name: stats.get(name) for name in STAT_FIELDS},
    }
