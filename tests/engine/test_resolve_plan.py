"""The resolve plan: boundaries, chained path keys, fallback order and prefetch keys, without a model.

The last tests check on the tiny model that assembly reads exactly what the plan names.
"""

import pytest
import torch

import fusionrag_llm.storage.keys as store_keys
from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.engine.plan import ResolveCounts, plan_context
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.fusion.entry_keys import EntryKeys
from fusionrag_llm.methods import make_plan
from fusionrag_llm.request import Segment
from fusionrag_llm.storage import path_key

FINGERPRINT = "ab" * 32
S0 = tuple(range(1, 21))
KEYS = EntryKeys(FINGERPRINT, S0, lossless=True)
LOSSY = EntryKeys(FINGERPRINT, S0, lossless=False)
FUSIONRAG, FULL_REUSE, FULL = make_plan("fusionrag_paper", 0.2), make_plan("full_reuse"), make_plan("full_attention")


def chunk(seed: int, size: int = 128) -> tuple[int, ...]:
    return tuple(100 + (seed * 7 + i) % 100 for i in range(size))  # three digits each: same bytes per token


def segments_of(num_chunks: int, prefix=S0, size: int = 128) -> list[Segment]:
    """prefix, chunk, (text, chunk)..., suffix: the shape ``build_segments`` gives."""
    out = [Segment("prefix", "", tuple(prefix)), Segment("chunk", "", chunk(0, size))]
    for index in range(1, num_chunks):
        out += [Segment("text", "", (10, 10)), Segment("chunk", "", chunk(index, size))]
    return out + [Segment("suffix", "", (5, 6, 7))]


def test_blocks_end_at_the_prefix_and_at_each_chunk_and_cover_the_text_before_it():
    segments = segments_of(3)
    plan = plan_context(segments, FUSIONRAG, KEYS, prefix_cache=True)
    assert [(b.segment, b.start, b.end) for b in plan.boundaries] == [(0, 0, 20), (1, 20, 148), (3, 148, 278),
                                                                      (5, 278, 408)]  # fmt: skip
    assert [(s.start, s.end) for s in plan.segments][-3:] == [(278, 280), (280, 408), (408, 411)]
    assert [s.path_key is not None for s in plan.segments] == [True, True, False, True, False, True, False]
    assert plan.block_ids(plan.boundaries[2]) == (10, 10, *chunk(1))


def test_block_keys_chain_on_the_block_before():
    plan = plan_context(segments_of(3), FUSIONRAG, KEYS, prefix_cache=True)
    previous = None
    for boundary in plan.boundaries:
        assert boundary.key == KEYS.path_block_key(previous, plan.block_ids(boundary))
        previous = boundary.key
    assert previous == path_key(FINGERPRINT, *(plan.block_ids(b) for b in plan.boundaries))
    other = plan_context(segments_of(3, prefix=(*S0[:-1], 99)), FUSIONRAG, KEYS, prefix_cache=True)
    assert all(a.key != b.key for a, b in zip(plan.boundaries, other.boundaries)), "a prefix change reaches every block"


def test_chunks_fall_back_from_their_variant_to_plain():
    plan = plan_context(segments_of(3), FUSIONRAG, KEYS, prefix_cache=True)
    later = plan.segments[3]
    assert [(c.variant, c.key) for c in later.candidates] == [("fused", KEYS.key(later.token_ids, "fused")),
                                                               ("plain", KEYS.key(later.token_ids, "plain"))]  # fmt: skip
    first = plan.segments[1]  # right after S0: its plain entry is its path's exact KV
    assert first.exact_plain and [c.variant for c in first.candidates] == ["plain"]
    assert [c.variant for c in plan_context(segments_of(2), FULL_REUSE, KEYS, True).segments[3].candidates] == ["plain"]
    assert all(not s.candidates for s in plan_context(segments_of(2), FULL, KEYS, True).segments)
    assert all(not s.candidates for s in plan.segments if s.kind != "chunk")


def test_after_another_prefix_no_chunk_is_exact():
    plan = plan_context(segments_of(2, prefix=(7, 7, 7)), FUSIONRAG, KEYS, prefix_cache=True)
    assert not any(s.exact_plain for s in plan.segments)
    assert [c.variant for c in plan.segments[1].candidates] == ["fused", "plain"]


def test_a_quantized_store_has_no_path_blocks_and_no_exact_chunk():
    plan = plan_context(segments_of(3), FUSIONRAG, LOSSY, prefix_cache=True)
    assert plan.boundaries == () and not plan.exact_blocks
    assert not any(s.exact_plain or s.path_key for s in plan.segments)
    # the first chunk after S0 still reads its plain entry (its exact KV up to the codec), not a fused one
    chunk_candidates = [[c.variant for c in s.candidates] for s in plan.segments if s.kind == "chunk"]
    assert chunk_candidates == [["plain"], ["fused", "plain"], ["fused", "plain"]]
    chunk_segments = [s for s in plan.segments if s.kind == "chunk"]
    assert plan.prefetch_keys() == [(s.candidates[0].key, s.token_ids) for s in chunk_segments]


def test_without_the_prefix_cache_only_the_prefix_is_a_block():
    plan = plan_context(segments_of(3), FUSIONRAG, KEYS, prefix_cache=False)
    assert [(b.segment, b.start, b.end) for b in plan.boundaries] == [(0, 0, 20)]
    assert plan.boundaries[0].key == path_key(FINGERPRINT, S0)


def test_prefetch_keys_are_the_blocks_then_each_chunks_first_choice_once():
    segments = segments_of(3)
    segments[5] = segments[3]  # the same chunk twice: fetched once
    plan = plan_context(segments, FUSIONRAG, KEYS, prefix_cache=True)
    wanted = plan.prefetch_keys()
    blocks = [(b.key, plan.block_ids(b)) for b in plan.boundaries]
    first_choices = [(s.candidates[0].key, s.token_ids) for s in plan.segments if s.candidates]
    assert wanted == list(dict(blocks + first_choices).items())
    assert len(wanted) == len(blocks) + 2  # three chunks, two distinct first choices
    assert plan.segments[3].candidates[0].key == plan.segments[5].candidates[0].key


def test_a_method_that_blends_both_entries_prefetches_the_plain_one_too():
    plan = plan_context(segments_of(3), make_plan("fusionrag", 0.2), KEYS, prefix_cache=True)  # chunk_kv="blend"
    wanted = [key for key, _ in plan.prefetch_keys()]
    for segment in plan.segments:
        if segment.candidates and segment.candidates[0].variant == "fused":
            fused, plain = (c.key for c in segment.candidates)
            assert wanted.index(fused) + 1 == wanted.index(plain)
    assert len(wanted) == len(plan.boundaries) + 1 + 2 * 2  # the exact first chunk, then two with both entries


def hashed_bytes_per_token(monkeypatch, num_chunks: int) -> float:
    hashed = [0]
    digest = store_keys._digest

    def counting(payload):
        hashed[0] += len(store_keys.canonical_json(payload))
        return digest(payload)

    monkeypatch.setattr(store_keys, "_digest", counting)
    plan = plan_context(segments_of(num_chunks), FUSIONRAG, KEYS, prefix_cache=True)
    monkeypatch.setattr(store_keys, "_digest", digest)
    return hashed[0] / len(plan.prompt_ids)


def test_a_plan_hashes_each_prompt_token_a_bounded_number_of_times(monkeypatch):
    """Linear in the prompt: 32k tokens of chunks cost per token what 1k do (hashing every boundary's
    whole prefix, 256 boundaries would cost ~128 times as much per token)."""
    small = hashed_bytes_per_token(monkeypatch, 8)  # ~1k tokens
    large = hashed_bytes_per_token(monkeypatch, 256)  # ~32k tokens
    assert large < 3 * small
    assert small < 3 * 4 * 3  # each token, ~4 JSON bytes, in its block, its chunk keys (fused and plain)


def test_counts_merge_into_generation_stats():
    counts = ResolveCounts(tier_hits={"host": 2, "disk": 1}, computed_tokens=5)
    counts.path_hits["chunk"] += 3
    counts.variant_hits["fused"] += 3
    stats = GenerationStats(computed_tokens=1)
    counts.merge_into(stats)
    counts.merge_into(stats)
    assert stats.path_hits == {"exact": 0, "chunk": 6, "miss": 0} and stats.variant_hits["fused"] == 6
    assert stats.tier_hits == {"device": 0, "host": 4, "disk": 2} and stats.computed_tokens == 11


# ------------------------------------------------------------------ assembly reads what the plan names
TEXTS = ["The ferry to Orkney leaves at noon.", "Harbour fees rose in May.", "Gulls nest on the pier."]


@pytest.fixture()
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"kv_codec": "model"})  # exact chunk entries: the first is a path block
    rag.add_chunks(TEXTS, embeddings=[[1, 0], [1, 1], [0, 1]], neighbors=1)
    return rag


def assemble_recording_reads(rag, monkeypatch, segments, run_plan):
    resolver = rag.engine.resolver()  # the engine's prefix cache is on
    context_plan = resolver.plan(segments, run_plan)
    reads, get = [], rag.store.get

    def recording(key, **kw):
        reads.append((key, tuple(kw["expect_token_ids"])))
        return get(key, **kw)

    monkeypatch.setattr(rag.store, "get", recording)
    cache = rag.engine.model.new_cache(len(context_plan.prompt_ids))
    resolved, counts = resolver.assemble_plan(context_plan, cache)
    monkeypatch.setattr(rag.store, "get", get)
    return context_plan, reads, resolved, counts


def test_assembly_reads_the_prefetch_keys_in_order(rag, monkeypatch):
    segments = rag.segments(RAGRequest(chunks=TEXTS, question="When does the ferry leave?"))
    plan, reads, resolved, counts = assemble_recording_reads(rag, monkeypatch, segments, FUSIONRAG)
    wanted = plan.prefetch_keys()
    blocks = [(b.key, plan.block_ids(b)) for b in plan.boundaries]
    # S0's block is stored by ingestion, the next block is missing: the walk stops, chunks follow
    assert reads == blocks[:2] + wanted[len(blocks):]
    assert resolved.matched == 2  # S0, then the first chunk's exact plain entry
    assert counts.path_hits == {"exact": 1, "chunk": 2, "miss": 0} and counts.variant_hits["fused"] == 2


def test_once_the_path_is_stored_assembly_reads_only_its_blocks(rag, monkeypatch):
    request = RAGRequest(chunks=TEXTS, question="When does the ferry leave?")
    rag.generate(request, method="full_attention", max_new_tokens=1)  # stores every block of the path
    plan, reads, resolved, counts = assemble_recording_reads(rag, monkeypatch, rag.segments(request), FUSIONRAG)
    assert reads == [(b.key, plan.block_ids(b)) for b in plan.boundaries]
    assert set(reads) <= set(plan.prefetch_keys())
    assert resolved.matched == len(plan.boundaries) and counts.path_hits["exact"] == 3


def test_another_codec_gets_keys_of_its_own_and_no_exact_blocks():
    import torch

    from fusionrag_llm.fusion.entry_keys import EntryKeys

    fingerprint = "ab" * 32
    raw = EntryKeys.for_store(fingerprint, (1, 2), torch.float32, None)
    coded = EntryKeys.for_store(fingerprint, (1, 2), torch.float32, None, codec_id="int8")
    assert raw.fingerprint == fingerprint and raw.lossless
    assert coded.fingerprint != fingerprint and not coded.lossless
    assert coded.key((5, 6), "plain") != raw.key((5, 6), "plain")


def test_the_request_layout_carries_every_chunks_span(tiny_rag):
    from fusionrag_llm import RAGRequest

    request = RAGRequest(chunks=["The first chunk says one thing.", "The second chunk says another."], question="Which?")
    segments = tiny_rag.segments(request)
    resolver = tiny_rag.engine.resolver()
    context = resolver.plan(segments, make_plan("full_reuse"))
    cache = tiny_rag.engine.model.new_cache(sum(len(s.token_ids) for s in segments))
    resolved, _ = resolver.assemble_plan(context, cache)
    starts = [sum(len(s.token_ids) for s in segments[:i]) for i in range(len(segments))]
    expected = tuple((starts[i], starts[i] + len(s.token_ids)) for i, s in enumerate(segments) if s.kind == "chunk")
    assert resolved.layout.chunk_spans == expected and len(expected) == 2


def test_entries_read_without_a_copy_stay_pinned_until_released(rag):
    segments = rag.segments(RAGRequest(chunks=TEXTS, question="When does the ferry leave?"))
    resolver = rag.engine.resolver()  # the engine's prefix cache is on
    context_plan = resolver.plan(segments, FUSIONRAG)
    cache = rag.engine.model.new_cache(len(context_plan.prompt_ids))
    resolver.assemble_plan(context_plan, cache)
    read = list(resolver.pinned)
    assert len(read) == 4  # S0's block, the first chunk's exact plain entry, two fused entries
    assert all(rag.store.pin_count(key) == 1 for key in read) and rag.store.stats().pinned == 4
    resolver.release()
    assert rag.store.stats().pinned == 0 and resolver.pinned == []


def test_prefetched_entries_are_pinned_until_assembled_and_never_leak(rag, monkeypatch):
    engine = rag.engine
    requests = [RAGRequest(chunks=TEXTS[i:] + TEXTS[:i], question="When does the ferry leave?") for i in range(3)]
    handed = []
    make = engine.resolver

    def recording(preloaded=None, pinned=(), *args, **kwargs):
        handed.append([(key, rag.store.pin_count(key)) for key in pinned])
        return make(preloaded, pinned, *args, **kwargs)

    monkeypatch.setattr(engine, "resolver", recording)
    rag.generate_many(requests, max_new_tokens=2)  # lookahead: later requests load on the loader thread
    prefetched = [keys for keys in handed if keys]
    assert prefetched and all(count >= 1 for keys in prefetched for _, count in keys)
    assert rag.store.stats().pinned == 0
    segments = rag.segments(requests[0])
    dropped = engine.add_request(segments, FUSIONRAG, 2, prefetch=4)
    engine.kv.start_load([dropped])
    assert engine.abort(dropped.request_id)
    engine.kv.release_if_idle([])
    assert rag.store.stats().pinned == 0


def test_a_bf16_store_keeps_exact_blocks_under_the_models_keys():
    bf16 = EntryKeys.for_store(FINGERPRINT, S0, torch.float32, torch.bfloat16)
    plan = plan_context(segments_of(3), FUSIONRAG, bf16, prefix_cache=True)
    lossless = plan_context(segments_of(3), FUSIONRAG, KEYS, prefix_cache=True)
    assert plan.exact_blocks and [b.key for b in plan.boundaries] == [b.key for b in lossless.boundaries]
    first = plan.segments[1]  # plain first, but approximate: reused (and recomputed at r = 1), not exact
    assert not first.exact_plain and [c.variant for c in first.candidates] == ["plain"]
    assert first.candidates[0].key != lossless.segments[1].candidates[0].key
