"""The step API: requests share batched forwards and still get exactly the answers they get alone."""

import threading

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.engine.streaming import IncrementalText
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.methods import make_plan
from fusionrag_llm.models.forward import BatchContext
from fusionrag_llm.models.llama import ForwardPass
from method_spy import spy

CHUNKS = [
    "The river Sel floods the lower town of Brightwater every spring after the snow melts.",
    "Brightwater's mayor in 1901 was Ida Renn, who built the first stone embankment.",
    "Renn's embankment was rebuilt in 1950 after a storm broke its eastern wall.",
    "The eastern wall faces the old mill, which grinds barley from the valley farms.",
]
REQUESTS = [
    RAGRequest(chunks=[CHUNKS[1], CHUNKS[2], CHUNKS[0]], question="Who built the embankment?"),
    RAGRequest(chunks=[CHUNKS[3], CHUNKS[0]], question="What does the mill grind?"),
    RAGRequest(chunks=[CHUNKS[2]], question="When was it rebuilt?"),
    RAGRequest(chunks=[CHUNKS[0], CHUNKS[1], CHUNKS[2], CHUNKS[3]], question="Which river floods the town?"),
]


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1]], neighbors=2)
    return rag


def _batched_calls(rag):
    """Record how many sequences each batched forward carried."""
    sizes = []
    original = rag.engine.model.forward_batch

    def spy(steps, caches):
        sizes.append(len(steps))
        return original(steps, caches)

    rag.engine.model.forward_batch = spy
    return sizes


@pytest.mark.parametrize("method, ratio", [("full_attention", 1.0), ("full_reuse", 0.0), ("cacheblend", 0.3),
                                           ("fusionrag", 0.15)])  # fmt: skip
def test_generate_many_batches_decode_and_equals_one_by_one(rag, method, ratio):
    alone = [rag.generate(r, method=method, recompute_ratio=ratio, max_new_tokens=6) for r in REQUESTS]
    sizes = _batched_calls(rag)
    try:
        together = rag.generate_many(REQUESTS, method=method, recompute_ratio=ratio, max_new_tokens=6)
    finally:
        del rag.engine.model.forward_batch
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.text for g in together] == [g.text for g in alone]
    assert sizes and max(sizes) == len(REQUESTS)  # the four prefills, then decode steps of all four, in one forward
    assert all(g.finish_reason in ("stop", "length") for g in together)


def test_forward_batch_equals_separate_forwards(rag, monkeypatch):
    """A prefill and a decode step of two different requests in one forward give each its own result."""
    model = rag.engine.model
    ids = [torch.arange(5, 25), torch.arange(40, 47)]

    def prefilled(tokens):
        cache = model.new_cache(len(tokens) + 1)
        model(ForwardPass(tokens, torch.arange(len(tokens)), cache.reserve(len(tokens))), cache)
        return cache

    def passes(caches):
        decode = ForwardPass(torch.tensor([3]), torch.tensor([len(ids[0])]), caches[0].reserve(1))
        prefill = ForwardPass(ids[1], torch.arange(len(ids[1])), caches[1].reserve(len(ids[1])), capture_raw_kv=True)
        return [decode, prefill]

    separate_caches = [prefilled(ids[0]), model.new_cache(len(ids[1]))]
    separate = [model(step, cache) for step, cache in zip(passes(separate_caches), separate_caches)]
    batched_caches = [prefilled(ids[0]), model.new_cache(len(ids[1]))]
    layouts, attend = [], BatchContext.attend

    def spy(self, layer, q, k, v):  # every layer's attention output of both sequences
        out = attend(self, layer, q, k, v)
        layouts.append((out.shape[1], out.transpose(0, 1).is_contiguous()))
        return out

    monkeypatch.setattr(BatchContext, "attend", spy)
    batched = model.forward_batch(passes(batched_caches), batched_caches)
    # written token-major: the output projection reads [tokens, heads x dim] rows without a copy
    assert layouts == [(1 + len(ids[1]), True)] * model.cfg.num_layers
    for one, many in zip(separate, batched):
        torch.testing.assert_close(many.logits, one.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched[1].raw_keys, separate[1].raw_keys, atol=1e-6, rtol=1e-6)
    assert batched[0].raw_keys is None
    for one, many in zip(separate_caches, batched_caches):
        torch.testing.assert_close(many.keys[:, :, : many.length], one.keys[:, :, : one.length], atol=1e-6, rtol=1e-6)


def test_admission_batches_the_selection_forwards_and_selects_as_alone(rag):
    """fusionrag's scoring forwards of every admitted sequence run as one batched forward, and each
    sequence gets the tokens it gets alone."""
    alone = {}
    for request in REQUESTS:
        method, seen = spy("fusionrag")
        out = rag.generate(request, method=method, recompute_ratio=0.15, max_new_tokens=1)
        alone[tuple(out.prompt_ids)] = seen[0].prefill.selected.tolist()
    engine = rag.engine
    method, seen = spy("fusionrag")
    seqs = [engine.add_request(rag.segments(r), make_plan(method, 0.15), 1) for r in REQUESTS]
    sizes = _batched_calls(rag)
    try:
        engine.step()  # admits the four: their scoring passes, then their sparse prefills
    finally:
        del rag.engine.model.forward_batch
    engine.run_until_finished(seqs)
    scored = [picks for picks in alone.values() if picks]  # a lone first chunk is exact: nothing to select
    assert len(scored) == 3 and sizes[0] == len(scored)  # one forward for every scoring pass
    assert len(seen) == len(REQUESTS)
    for one in seen:
        assert one.prefill.selected.tolist() == alone[tuple(one.layout.token_ids.tolist())]


def test_step_api_admits_decodes_and_aborts(rag):
    engine = rag.engine
    plan = make_plan("fusionrag", 0.15)
    expected = [rag.generate(r, max_new_tokens=8) for r in REQUESTS[:2]]
    first = engine.add_request(rag.segments(REQUESTS[0]), plan, 8)
    second = engine.add_request(rag.segments(REQUESTS[1]), plan, 8)
    assert engine.has_unfinished() and not first.token_ids
    engine.step()  # both admitted: prefilled, first token taken
    assert len(first.token_ids) == 1 or first.finished
    assert engine.abort(second.request_id) and second.finish_reason == "abort"
    assert not engine.abort(second.request_id)  # already gone
    kept = list(second.token_ids)
    engine.run_until_finished([first])
    assert second.token_ids == kept  # an aborted request gets no more tokens
    assert first.token_ids == expected[0].token_ids
    assert not engine.has_unfinished()


def test_threads_share_the_engine_and_get_their_own_answers(rag):
    expected = [rag.generate(r, max_new_tokens=6).token_ids for r in REQUESTS]
    results = [None] * len(REQUESTS)

    def ask(index):
        results[index] = rag.generate(REQUESTS[index], max_new_tokens=6).token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(REQUESTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == expected


def test_a_failing_request_fails_alone(rag, monkeypatch):
    engine = rag.engine
    plan = make_plan("fusionrag", 0.15)
    original = engine.kv.take
    bad = engine.add_request(rag.segments(REQUESTS[0]), plan, 4)

    def failing(seq):
        if seq is bad:
            raise OSError("disk went away")
        return original(seq)

    monkeypatch.setattr(engine.kv, "take", failing)
    good = engine.add_request(rag.segments(REQUESTS[1]), plan, 4)
    with pytest.raises(OSError, match="disk went away"):
        engine.run_until_finished([bad, good])
    assert bad.finish_reason == "error" and good.finish_reason in ("stop", "length")
    assert good.token_ids == rag.generate(REQUESTS[1], max_new_tokens=4).token_ids


def test_stream_close_leaves_the_batch(rag):
    stream = rag.stream(REQUESTS[0], max_new_tokens=8)
    stream.close()
    assert list(stream) == [] and not rag.engine.has_unfinished()


def test_incremental_text_equals_decoding_everything(rag):
    decode = rag.tokenizer.decode
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, rag.engine.model.cfg.vocab_size, (200,), generator=generator).tolist()
    text = IncrementalText(decode)
    deltas = [text.add(token) for token in ids] + [text.flush()]
    assert "".join(deltas) == text.text == decode(ids)


def test_stop_strings_end_the_answer_before_them(rag):
    full = rag.generate(REQUESTS[0], max_new_tokens=24)
    assert len(full.text) > 6, full.text
    stop = full.text[3:5]
    cut = full.text[: full.text.index(stop)]
    out = rag.generate(REQUESTS[0], max_new_tokens=24, stop=[stop, "never appears"])
    assert out.text == cut and out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: len(out.token_ids)] and len(out.token_ids) <= len(full.token_ids)
    stream = rag.stream(REQUESTS[0], max_new_tokens=24, stop=stop)
    deltas = list(stream)
    assert "".join(deltas) == stream.text == cut and stream.finish_reason == "stop"
    batch = rag.generate_many(REQUESTS[:2], max_new_tokens=24, stop=stop)
    assert batch[0].text == cut


def test_a_stop_string_completed_by_the_last_allowed_token_still_stops(rag):
    full = rag.generate(REQUESTS[0], max_new_tokens=24, sampling={"ignore_eos": True})
    decode = rag.engine.tokenizer.decode
    # the first token whose text is new: stopping on it with exactly that many tokens allowed
    count, stop = next((n, decode(full.token_ids[n - 1 : n])) for n in range(2, 25)
                       if decode(full.token_ids[n - 1 : n]).isprintable()
                       and decode(full.token_ids[n - 1 : n]) not in decode(full.token_ids[: n - 1]))  # fmt: skip
    cut = decode(full.token_ids[: count - 1])
    out = rag.generate(REQUESTS[0], max_new_tokens=count, stop=[stop], sampling={"ignore_eos": True})
    assert out.text == cut and out.finish_reason == "stop"
    stream = rag.stream(REQUESTS[0], max_new_tokens=count, stop=[stop], sampling={"ignore_eos": True})
    assert "".join(stream) == cut and stream.finish_reason == "stop"


def test_stop_strings_decode_only_new_tokens(rag, monkeypatch):
    """Looking for a stop string decodes a short window of new tokens per step, never the whole
    answer again (the stop string here never appears, so all 40 tokens are generated)."""
    decode, longest = rag.engine.tokenizer.decode, []
    monkeypatch.setattr(rag.engine.tokenizer, "decode", lambda ids, *a, **k: longest.append(len(ids)) or decode(ids, *a, **k))
    out = rag.generate(REQUESTS[0], max_new_tokens=40, stop=["\x00never\x00"], sampling={"ignore_eos": True})
    assert len(out.token_ids) == 40
    during = longest[:-1]  # the last call decodes the returned text once
    assert len(during) >= 40 and max(during) < 20  # the whole answer would be 40


@pytest.mark.parametrize("bad", ["", [""], [1], b"x", ["a"] * 17])
def test_bad_stop_values_are_refused(rag, bad):
    from fusionrag_llm import FusionRAGError

    with pytest.raises(FusionRAGError, match="stop"):
        rag.generate(REQUESTS[0], max_new_tokens=2, stop=bad)


def test_a_dropped_stream_leaves_the_batch(rag):
    import gc

    stream = rag.stream(REQUESTS[0], max_new_tokens=8)
    assert rag.engine.has_unfinished()  # prefilled, still decoding
    del stream
    gc.collect()
    assert not rag.engine.has_unfinished()


@pytest.mark.parametrize("method, ratio", [("full_attention", 1.0), ("full_reuse", 0.0), ("fusionrag", 0.3)])
def test_prompt_tokens_split_by_source_add_up(rag, method, ratio):
    unseen = RAGRequest(chunks=[CHUNKS[2], "A chunk no one registered, about the tide tables of the harbour."],
                        question="When is high tide?")  # fmt: skip
    for request in (REQUESTS[3], unseen):
        s = rag.generate(request, method=method, recompute_ratio=ratio, max_new_tokens=1).stats
        parts = (s.exact_tokens, s.reused_tokens, s.recomputed_tokens, s.missed_tokens, s.fresh_tokens)
        assert sum(parts) == s.prompt_tokens and min(parts) >= 0, parts


def test_a_chunk_computed_on_a_miss_is_not_counted_as_reused():
    fresh = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    request = RAGRequest(chunks=[CHUNKS[0], CHUNKS[1]], question="Who?")
    first = fresh.generate(request, method="full_reuse", max_new_tokens=1).stats
    second_chunk = len(fresh.tokenizer.encode(CHUNKS[1]))  # the first chunk, right after the prefix, is exact
    assert first.path_hits["miss"] == 2 and first.missed_tokens == second_chunk and first.reused_tokens == 0
    again = fresh.generate(request, method="full_reuse", max_new_tokens=1).stats
    assert again.missed_tokens == 0 and again.reused_tokens == first.missed_tokens + first.reused_tokens


def test_ignore_eos_decodes_every_asked_token_past_an_end_token():
    rag = FusionRAG.from_pretrained("tiny")  # its own instance: the test changes the tokenizer's end tokens
    first = rag.generate(REQUESTS[0], method="full_attention", max_new_tokens=5)
    rag.engine.tokenizer.stop_ids = frozenset({first.token_ids[1]})  # the second answer token ends the answer
    ended = rag.generate(REQUESTS[0], method="full_attention", max_new_tokens=5)
    assert ended.token_ids == first.token_ids[:1] and ended.finish_reason == "stop"
    forced = rag.generate(REQUESTS[0], method="full_attention", max_new_tokens=5, sampling={"ignore_eos": True})
    assert forced.token_ids == first.token_ids and forced.finish_reason == "length"
    streamed = rag.stream(REQUESTS[0], method="full_attention", max_new_tokens=5, sampling={"ignore_eos": True})
    assert "".join(streamed) == first.text and streamed.token_ids == first.token_ids
    batch = rag.generate_many(REQUESTS[:2], method="full_attention", max_new_tokens=5, sampling={"ignore_eos": True})
    assert [len(out.token_ids) for out in batch] == [5, 5]
    with pytest.raises(FusionRAGError, match="ignore_eos must be True or False"):
        rag.generate(REQUESTS[0], max_new_tokens=2, sampling={"ignore_eos": "yes"})


def test_requests_wait_for_cache_slots_and_get_the_answers_they_get_alone(rag):
    from fusionrag_llm.engine.scheduler import SchedulerConfig
    from fusionrag_llm.errors import PromptTooLongError

    alone = [rag.generate(r, max_new_tokens=6) for r in REQUESTS]
    need = [g.stats.prompt_tokens + 6 for g in alone]
    scheduler = rag.engine.scheduler
    held, original = [], scheduler.schedule

    def schedule(is_ready):  # the slots of every sequence in each step
        step = original(is_ready)
        held.append(sum(seq.num_prompt_tokens + seq.max_new_tokens for seq in step.prefills + step.decodes))
        return step

    scheduler.config = SchedulerConfig(max_kv_tokens=max(need))
    scheduler.schedule = schedule
    try:
        together = rag.generate_many(REQUESTS, max_new_tokens=6)
        largest = REQUESTS[need.index(max(need))]
        with pytest.raises(PromptTooLongError, match=rf"needs {2 * max(need)} cache slots .* each of 2 answers.* may hold {max(need)} together"):
            rag.generate(largest, max_new_tokens=6, n=2)
        with pytest.raises(PromptTooLongError, match="max_kv_tokens"):
            rag.generate(largest, max_new_tokens=7)
    finally:
        scheduler.config = SchedulerConfig()
        del scheduler.schedule
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert max(held) <= max(need) < sum(need)  # never more than the slots, so some requests waited
    assert len(held) > 6 + 1  # more steps than one wave of 6 new tokens
