"""LangChain calls: sync ``batch`` runs as engine batches, and per-call options take other ecosystems'
spellings of ``max_tokens`` with the constructor's checks."""

import time

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage

from fusionrag_llm.integrations.langchain import ChatFusionRAG, FusionRAGLLMLangChain

CHUNKS = ["The Keldmouth lighthouse was built by Ada Brenner in 1871.", "Its lamp burned whale oil until 1902."]
PROMPTS = [f"Context:\n{CHUNKS[0]}\n{CHUNKS[1]}\n\nQuestion: {q}"
           for q in ["Who built the lighthouse?", "When was it built?", "What did the lamp burn?", "Until when?"]]  # fmt: skip


class GeneratedTokens(BaseCallbackHandler):
    def on_llm_end(self, response, **kwargs) -> None:
        self.count = response.generations[0][0].generation_info["fusionrag_stats"]["generated_tokens"]


@pytest.fixture
def engine(fresh_rag):
    fresh_rag.add_chunks(CHUNKS, embeddings=[[1.0, 0.0], [0.0, 1.0]])
    return fresh_rag


@pytest.fixture
def steps(engine, monkeypatch):
    """Counts the engine's steps (each runs one batched forward)."""
    count = [0]
    step = engine.engine.step

    def counted():
        count[0] += 1
        return step()

    monkeypatch.setattr(engine.engine, "step", counted)
    return count


def _steps_of(steps, call):
    before = steps[0]
    result = call()
    return result, steps[0] - before


def test_llm_batch_is_one_engine_batch_with_the_answers_of_one_by_one(engine, steps):
    llm = FusionRAGLLMLangChain(rag=engine, max_tokens=8)
    alone, one_by_one = _steps_of(steps, lambda: [llm.invoke(prompt) for prompt in PROMPTS])
    batched, together = _steps_of(steps, lambda: llm.batch(PROMPTS))
    assert batched == alone and any(text for text in alone)
    assert together < one_by_one / 2, f"batch took {together} engine steps, one by one {one_by_one}"
    stop = alone[0][2:4]  # a stop string applies to every answer of the batch
    stopped = llm.batch(PROMPTS, stop=[stop])
    assert stopped == [llm.invoke(prompt, stop=[stop]) for prompt in PROMPTS]
    assert stopped[0] == alone[0][: alone[0].find(stop)]


def _all_queued(rag, count: int, monkeypatch) -> None:
    """Hold the engine's first step until ``count`` requests are in it (at most 10 s). A chat model's
    ``batch`` sends its inputs from worker threads, which the engine batches only if they arrive
    before the first of them has finished; on a fast engine the threads could otherwise run one
    after another, and the test would show the operating system's scheduling instead."""
    engine, step = rag.engine, rag.engine.step

    def held():
        deadline = time.monotonic() + 10
        while len(engine.scheduler.waiting) + len(engine.scheduler.running) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        monkeypatch.setattr(engine, "step", step)  # once: the rest of the run steps freely
        return step()

    monkeypatch.setattr(engine, "step", held)


def test_chat_batch_answers_like_one_by_one(engine, steps, monkeypatch):
    chat = ChatFusionRAG(rag=engine, max_tokens=8)
    alone, one_by_one = _steps_of(steps, lambda: [chat.invoke([HumanMessage(p)]).content for p in PROMPTS])
    _all_queued(engine, len(PROMPTS), monkeypatch)
    batched, together = _steps_of(steps, lambda: [m.content for m in chat.batch([[HumanMessage(p)] for p in PROMPTS])])
    assert batched == alone
    assert together < one_by_one, f"batch took {together} engine steps, one by one {one_by_one}"


@pytest.mark.parametrize("model_class", [ChatFusionRAG, FusionRAGLLMLangChain])
@pytest.mark.parametrize("spelling", ["max_tokens", "max_new_tokens", "num_predict", "max_completion_tokens"])
def test_each_spelling_of_max_tokens_bounds_one_call(engine, model_class, spelling):
    model = model_class(rag=engine, max_tokens=16)

    def generated(runnable, **kwargs) -> int:
        callback = GeneratedTokens()
        runnable.invoke(PROMPTS[0], config={"callbacks": [callback]}, **kwargs)
        return callback.count

    assert generated(model) > 2  # the setting, so that the bound below shows
    assert generated(model, **{spelling: 2}) <= 2
    assert generated(model.bind(**{spelling: 2})) <= 2


@pytest.mark.parametrize("options, error", [
    ({"max_tokens": 2, "num_predict": 3}, "max_tokens is given twice, as 'max_tokens' and as 'num_predict'"),
    ({"num_predicts": 2}, r"\(per call\) got an unknown argument 'num_predicts'; did you mean 'num_predict'\?"),
    ({"logprobs": True}, "does not support logprobs=True: answers carry no log-probabilities"),
    ({"num_predict": 0}, "max_new_tokens must be an int >= 1"),
    ({"temperature": -0.7}, "temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"),
    ({"top_p": 0}, r"top_p must be a number in \[1e-06, 1\]"),
])  # fmt: skip
def test_per_call_options_are_checked_like_the_constructors(engine, options, error):
    for model in (ChatFusionRAG(rag=engine), FusionRAGLLMLangChain(rag=engine)):
        with pytest.raises(ValueError, match=error):
            model.invoke(PROMPTS[0], **options)


def test_neutral_values_of_unsupported_settings_pass_per_call(engine):
    chat = ChatFusionRAG(rag=engine, max_tokens=3)
    assert chat.invoke(PROMPTS[0], n=1, best_of=1, logprobs=False).content == chat.invoke(PROMPTS[0]).content
