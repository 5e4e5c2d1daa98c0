"""Sampling through the adapters: the engine's ``SamplingParams`` under each framework's names, on every
call path, with the engine's checks. A seeded answer is compared with ``rag.generate(..., sampling=...)``."""

import asyncio

import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage

from fusionrag_llm.integrations.langchain import ChatFusionRAG, FusionRAGLLMLangChain
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

PROMPT = "Tell me about the sea."
TOKENS = 8
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "seed": 3}


def engine_ids(rag, request=PROMPT, **sampling) -> list[int]:
    """The engine's own answer; the adapters' ``seed`` is the sampling's."""
    return list(rag.generate(request, max_new_tokens=TOKENS, sampling=sampling).token_ids)


def engine_text(rag, request=PROMPT, **sampling) -> str:
    return rag.generate(request, max_new_tokens=TOKENS, sampling=sampling).text


def text_of(reply) -> str:
    return reply if isinstance(reply, str) else reply.content


@pytest.fixture(params=[ChatFusionRAG, FusionRAGLLMLangChain], ids=lambda model: model.__name__)
def model_class(request):
    return request.param


def test_the_seeded_answer_is_the_engines_and_differs_from_greedy(rag):
    assert engine_ids(rag, **SAMPLED) != engine_ids(rag), "the tiny model should sample away from greedy"
    assert engine_ids(rag, **SAMPLED) != engine_ids(rag, **{**SAMPLED, "seed": 4}), "the seed should matter"


def test_langchain_settings_sample_as_the_engine_does(rag, model_class):
    model = model_class(rag=rag, max_tokens=TOKENS, **SAMPLED)
    assert text_of(model.invoke(PROMPT)) == engine_text(rag, **SAMPLED)
    assert text_of(model_class(rag=rag, max_tokens=TOKENS, temperature=0).invoke(PROMPT)) == engine_text(rag)
    assert text_of(model_class(rag=rag, max_tokens=TOKENS, temperature=0.0, seed=3).invoke(PROMPT)) == engine_text(rag)


def test_langchain_per_call_options_override_the_settings(rag, model_class):
    model = model_class(rag=rag, max_tokens=TOKENS)
    sampled = engine_text(rag, temperature=0.7, seed=3)
    assert text_of(model.invoke(PROMPT, temperature=0.7, seed=3)) == sampled
    assert text_of(model.bind(temperature=0.7, seed=3).invoke(PROMPT)) == sampled
    hot = model_class(rag=rag, max_tokens=TOKENS, temperature=0.7, seed=3)
    assert text_of(hot.invoke(PROMPT, temperature=0)) == engine_text(rag)
    assert text_of(hot.invoke(PROMPT, do_sample=False)) == engine_text(rag)  # greedy whatever the temperature
    assert text_of(hot.invoke(PROMPT, temperature=None)) == sampled  # None keeps the setting


def test_every_langchain_call_path_gives_the_seeded_answer(rag, model_class):
    model = model_class(rag=rag, max_tokens=TOKENS, **SAMPLED)
    expected = engine_text(rag, **SAMPLED)
    prompts = [PROMPT, PROMPT]
    assert [text_of(reply) for reply in model.batch(prompts)] == [expected, expected]
    assert "".join(text_of(chunk) for chunk in model.stream(PROMPT)) == expected
    assert text_of(asyncio.run(model.ainvoke(PROMPT))) == expected
    assert [text_of(reply) for reply in asyncio.run(model.abatch(prompts))] == [expected, expected]

    async def astreamed() -> str:
        return "".join([text_of(chunk) async for chunk in model.astream(PROMPT)])

    assert asyncio.run(astreamed()) == expected


def test_penalties_and_ollamas_spelling_reach_the_engine(rag, model_class):
    expected = engine_text(rag, repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.5, min_p=0.05)
    penalised = {"frequency_penalty": 0.5, "presence_penalty": 0.5, "min_p": 0.05}
    assert text_of(model_class(rag=rag, max_tokens=TOKENS, repeat_penalty=1.5, **penalised).invoke(PROMPT)) == expected
    model = model_class(rag=rag, max_tokens=TOKENS)
    assert text_of(model.invoke(PROMPT, repetition_penalty=1.5, **penalised)) == expected
    assert text_of(model.invoke(PROMPT, repeat_penalty=1.5, **penalised)) == expected
    with pytest.raises(ValueError, match="repetition_penalty is given twice"):
        model.invoke(PROMPT, repeat_penalty=1.5, repetition_penalty=1.2)


@pytest.mark.parametrize("options, message", [
    ({"temperature": -1}, r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\], got -1"),
    ({"top_p": 0}, r"top_p must be a number in \[1e-06, 1\], got 0"),
    ({"top_k": -2}, r"top_k must be an int >= 0 \(0 or -1: no limit\)"),
    ({"min_p": 1.5}, r"min_p must be a number in \[0, 1\]"),
    ({"repetition_penalty": 0}, r"repetition_penalty must be a number in \[0.01, 100\]"),
    ({"frequency_penalty": 3}, r"frequency_penalty must be a number in \[-2, 2\]"),
    ({"do_sample": True}, "do_sample=True needs a temperature > 0"),
])  # fmt: skip
def test_langchain_bad_sampling_values_raise_the_engines_message(rag, model_class, options, message):
    with pytest.raises(ValueError, match=message):
        model_class(rag=rag, **options)
    with pytest.raises(ValueError, match=message):
        model_class(rag=rag).invoke(PROMPT, **options)


def test_langchain_tracing_and_cache_keys_see_the_sampling(rag, model_class):
    model = model_class(rag=rag, temperature=0.7, top_p=0.9, seed=3)
    assert model._get_ls_params()["ls_temperature"] == 0.7
    assert model._get_ls_params(temperature=0.2)["ls_temperature"] == 0.2
    assert model._get_ls_params(do_sample=False)["ls_temperature"] == 0.0
    assert model_class(rag=rag)._get_ls_params()["ls_temperature"] == 0.0  # greedy
    assert {"temperature": 0.7, "top_p": 0.9, "seed": 3}.items() <= model._identifying_params.items()


def test_chat_messages_sample_as_the_engine_does(rag):
    chat = ChatFusionRAG(rag=rag, max_tokens=TOKENS, **SAMPLED)
    reply = chat.invoke([HumanMessage(PROMPT)])
    assert reply.content == engine_text(rag, [{"role": "user", "content": PROMPT}], **SAMPLED)


def test_llama_index_settings_sample_as_the_engine_does(rag):
    llm = FusionRAGLLM(rag=rag, max_new_tokens=TOKENS, temperature=0.9,
                       additional_kwargs={"top_p": 0.95, "top_k": 50, "seed": 3})  # fmt: skip
    expected = engine_ids(rag, **SAMPLED)
    assert llm.complete(PROMPT).raw["token_ids"] == expected
    in_generate_kwargs = FusionRAGLLM(rag=rag, max_new_tokens=TOKENS, generate_kwargs=SAMPLED)
    assert in_generate_kwargs.complete(PROMPT).raw["token_ids"] == expected
    assert FusionRAGLLM(rag=rag, max_new_tokens=TOKENS).complete(PROMPT).raw["token_ids"] == engine_ids(rag)
    unset = FusionRAGLLM(rag=rag, max_new_tokens=TOKENS, temperature=None)
    assert unset.complete(PROMPT).raw["token_ids"] == engine_ids(rag)


def test_llama_index_every_call_path_gives_the_seeded_answer(rag):
    llm = FusionRAGLLM(rag=rag, max_new_tokens=TOKENS, temperature=0.9, additional_kwargs={"seed": 5})
    expected = engine_ids(rag, temperature=0.9, seed=5)
    assert llm.complete(PROMPT).raw["token_ids"] == expected
    assert list(llm.stream_complete(PROMPT))[-1].raw["token_ids"] == expected
    assert asyncio.run(llm.acomplete(PROMPT)).raw["token_ids"] == expected

    async def astreamed():
        return [response async for response in await llm.astream_complete(PROMPT)][-1]

    assert asyncio.run(astreamed()).raw["token_ids"] == expected
    assert llm.complete(PROMPT).text == "".join(response.delta for response in llm.stream_complete(PROMPT))
    chat = [ChatMessage(role="user", content=PROMPT)]
    expected_chat = engine_ids(rag, [{"role": "user", "content": PROMPT}], temperature=0.9, seed=5)
    assert llm.chat(chat).raw["token_ids"] == expected_chat
    assert list(llm.stream_chat(chat))[-1].raw["token_ids"] == expected_chat
    assert asyncio.run(llm.achat(chat)).raw["token_ids"] == expected_chat


def test_llama_index_per_call_options_override_the_settings(rag):
    llm = FusionRAGLLM(rag=rag, max_new_tokens=TOKENS)
    sampled = engine_ids(rag, temperature=0.7, seed=3)
    assert llm.complete(PROMPT, temperature=0.7, seed=3).raw["token_ids"] == sampled
    hot = FusionRAGLLM(rag=rag, max_new_tokens=TOKENS, temperature=0.7, additional_kwargs={"seed": 3})
    assert hot.complete(PROMPT).raw["token_ids"] == sampled
    assert hot.complete(PROMPT, temperature=0).raw["token_ids"] == engine_ids(rag)
    assert hot.complete(PROMPT, do_sample=False).raw["token_ids"] == engine_ids(rag)
    penalised = engine_ids(rag, repetition_penalty=1.5, presence_penalty=1.0)
    assert llm.complete(PROMPT, repeat_penalty=1.5, presence_penalty=1.0).raw["token_ids"] == penalised


@pytest.mark.parametrize("arguments, message", [
    ({"temperature": -1}, r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"),
    ({"additional_kwargs": {"top_p": 0}}, r"top_p must be a number in \[1e-06, 1\]"),
    ({"generate_kwargs": {"top_p": 0}}, r"top_p must be a number in \[1e-06, 1\]"),
    ({"additional_kwargs": {"seed": -1}}, r"seed must be None or an int in \[0, 2\*\*63\), got -1"),
    ({"additional_kwargs": {"do_sample": True}}, "do_sample=True needs a temperature > 0"),
    ({"additional_kwargs": {"typical_p": 0.9}},
     r"additional_kwargs has unsupported key\(s\) \['typical_p'\]; accepted: .*top_p"),
    ({"additional_kwargs": {"stop": ["."]}}, r"unsupported key\(s\) \['stop'\]"),
    ({"additional_kwargs": {"seed": 1}, "generate_kwargs": {"seed": 2}},
     "seed given both in generate_kwargs and in additional_kwargs"),
    ({"temperature": 0.5, "generate_kwargs": {"temperature": 0.3}}, "temperature given both as argument"),
])  # fmt: skip
def test_llama_index_bad_sampling_settings_raise_clear_errors(rag, arguments, message):
    with pytest.raises(ValueError, match=message):
        FusionRAGLLM(rag=rag, **arguments)


def test_llama_index_bad_per_call_values_raise_clear_errors(rag):
    llm = FusionRAGLLM(rag=rag, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"):
        llm.complete(PROMPT, temperature=-1)
    with pytest.raises(ValueError, match=r"top_p must be a number in \[1e-06, 1\]"):
        llm.complete(PROMPT, top_p=0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['best_of'\]"):
        llm.complete(PROMPT, best_of=2)
