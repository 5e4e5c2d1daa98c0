"""A request whose own forward fails ends alone: the step's batched forward is run again pass by pass,
and every other sequence of the step (a prefill, a decode in flight) gives its solo answer."""

from dataclasses import dataclass

from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

from fusionrag_llm import FusionRAG, LayerHook, Method, MethodRun, RAGRequest
from fusionrag_llm.methods import make_plan


class Exploding(LayerHook):
    def after_write(self, layer, queries, cache, step) -> None:
        if layer == 1:
            raise RuntimeError("this request's hook failed at layer 1")


@dataclass(frozen=True)
class Boom(Method):
    name = "boom"
    chunk_kv = "plain"

    def start(self, prefill) -> MethodRun:
        run = MethodRun()
        run.hooks = (Exploding(),)
        return run


def test_a_failing_forward_fails_its_request_alone():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    other = RAGRequest(chunks=list(reversed(CHUNKS)), question="Who designed the lighthouse?")
    solo_first = rag.generate(REQUEST, method="full_attention", max_new_tokens=6).token_ids
    solo_other = rag.generate(other, method="full_attention", max_new_tokens=4).token_ids
    engine = rag.engine
    first = engine.add_request(rag.segments(REQUEST), make_plan("full_attention"), 6)
    engine.step()  # its prefill: it decodes in the next steps, batched with what comes
    good = engine.add_request(rag.segments(other), make_plan("full_attention"), 4)
    bad = engine.add_request(rag.segments(other), make_plan(Boom()), 4)
    while engine.has_unfinished():
        engine.step()
    assert bad.finish_reason == "error" and "hook failed at layer 1" in str(bad.error)
    assert good.finish_reason != "error" and good.token_ids == solo_other
    assert first.finish_reason != "error" and first.token_ids == solo_first


def test_a_request_with_method_hooks_batched_with_a_failing_one_starts_over_and_gives_its_solo_answer():
    """Its hooks ran in the failed batch (they may have changed its cache), so it is prefilled again from
    scratch in a step of its own; the decodes in flight wait that step and answer as alone."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    other = RAGRequest(chunks=list(reversed(CHUNKS)), question="Who designed the lighthouse?")
    solo_first = rag.generate(REQUEST, method="full_attention", max_new_tokens=6).token_ids
    solo = rag.generate(other, method="fusionrag", max_new_tokens=4)
    engine = rag.engine
    first = engine.add_request(rag.segments(REQUEST), make_plan("full_attention"), 6)
    engine.step()
    hooked = engine.add_request(rag.segments(other), make_plan("fusionrag"), 4)
    bad = engine.add_request(rag.segments(other), make_plan(Boom()), 4)
    engine.step()  # the batch fails: both prefills have hooks, so both go back to be run alone
    assert hooked.cache is None and not hooked.finished and not bad.finished
    while engine.has_unfinished():
        engine.step()
    assert bad.finish_reason == "error" and "hook failed at layer 1" in str(bad.error)
    assert hooked.finish_reason != "error" and hooked.token_ids == solo.token_ids
    assert hooked.stats.recomputed_tokens == solo.stats.recomputed_tokens  # counted once, not twice
    assert first.token_ids == solo_first
