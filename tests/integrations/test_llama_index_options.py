"""FusionRAGLLM takes what llama-index-llms-huggingface / -llama-cpp users pass, with the same meanings."""

import asyncio

import pytest
from llama_index.core.prompts import PromptTemplate

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations import llama_index as adapter
from fusionrag_llm.integrations.llama_index import FusionRAGLLM

PROMPT = "Say hi"
SYSTEM = "You answer in one word."


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ({"temperature": 0.0}, {"temperature": 0.0}),
        ({"temperature": None}, {"temperature": None}),
        ({"temperature": 0.7}, {"temperature": 0.7}),
        ({"additional_kwargs": {"top_p": 0.9, "repeat_penalty": 1.1, "seed": 1}},
         {"additional_kwargs": {"top_p": 0.9, "repeat_penalty": 1.1, "seed": 1}}),  # fmt: skip
        ({"generate_kwargs": {"temperature": 0.5, "top_k": 40, "do_sample": True}}, {"temperature": 0.0}),
        ({"max_tokens": 7}, {"max_new_tokens": 7, "num_output": 7}),
        ({"max_new_tokens": 9}, {"max_new_tokens": 9, "num_output": 9}),
        ({"context_window": 1024}, {"context_window": 1024}),
        ({"generate_kwargs": {"max_new_tokens": 5, "seed": 3, "stop": ["."], "temperature": 0, "do_sample": False}},
         {"num_output": 5}),  # fmt: skip
        ({"generate_kwargs": {"method": "full_attention"}, "temperature": 0}, {"method": "fusionrag"}),
        ({"is_chat_model": False}, {"is_chat_model": False}),
        ({"is_chat_model": True}, {"is_chat_model": True}),
        ({"system_prompt": SYSTEM}, {"system_prompt": SYSTEM}),
    ],
)
def test_accepted_arguments_keep_their_meaning(rag, arguments, expected):
    llm = FusionRAGLLM(rag=rag, **arguments)
    metadata = llm.metadata
    for name, value in expected.items():
        assert getattr(metadata if hasattr(metadata, name) else llm, name) == value
    if "context_window" not in arguments:
        assert metadata.context_window == rag.context_window  # only lowered when asked


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"temperature": -0.7}, r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"),
        ({"temperature": True}, "temperature\n.*valid number"),
        ({"max_tokens": 0}, "max_new_tokens must be an int >= 1"),
        ({"max_tokens": 4, "max_new_tokens": 5}, "given twice, as 'max_tokens' and as 'max_new_tokens'"),
        ({"context_window": 10**6}, "exceeds the model's window"),
        ({"context_window": 0}, "context_window must be an int >= 1"),
        ({"generate_kwargs": {"typical_p": 0.9, "num_beams": 2}}, r"unsupported key\(s\) \['num_beams', 'typical_p'\]"),
        ({"generate_kwargs": {"temperature": -0.5}}, "temperature must be 0 \(greedy\) or a number in \[0.01, 10000\]"),
        ({"generate_kwargs": {"do_sample": True}}, "do_sample=True needs a temperature > 0"),
        ({"generate_kwargs": {"method": "nope"}}, "nope"),
        ({"generate_kwargs": {"stop": 3}}, "stop must be a string or a list of strings"),
        ({"generate_kwargs": {"max_new_tokens": 4}, "max_tokens": 8}, "given both as argument"),
        ({"store": ":memory:"}, "store: only used when the adapter loads model_name"),
        ({"device": "cpu", "dtype": "float32"}, "device, dtype: only used when the adapter loads model_name"),
        ({"temprature": 0}, "unknown argument 'temprature'; did you mean 'temperature'"),
        ({"n_gpu_layers": 10}, "unknown argument 'n_gpu_layers'"),
    ],
)
def test_rejected_arguments_say_why(rag, arguments, message):
    with pytest.raises(ValueError, match=message):
        FusionRAGLLM(rag=rag, **arguments)


def test_loading_by_name_is_lazy_and_takes_store_device_dtype(rag, monkeypatch):
    calls = []

    def from_pretrained(name, **settings):
        calls.append((name, settings))
        return rag

    monkeypatch.setattr(adapter.FusionRAG, "from_pretrained", from_pretrained)
    adapter._load.cache_clear()
    try:
        llm = FusionRAGLLM(model_path="tiny", store=":memory:", device="cpu", dtype="float32", context_window=512)
        assert calls == [] and llm.model_name == "tiny"
        assert llm.metadata.context_window == 512 and calls == []  # a lowered window needs no model
        assert llm.engine is rag and calls == [("tiny", {"device": "cpu", "dtype": "float32", "store": ":memory:"})]
        too_wide = FusionRAGLLM(model_name="tiny", store=":memory:", context_window=rag.context_window + 1)
        with pytest.raises(ValueError, match="exceeds the model's window"):
            too_wide.complete(PROMPT)  # checked when the model is loaded
    finally:
        adapter._load.cache_clear()


def test_loading_by_name_answers_like_the_engine(rag):
    llm = FusionRAGLLM(model_name="tiny", store=":memory:", max_tokens=4)
    assert llm.engine is not rag and llm.engine is llm.engine
    out = llm.complete(PROMPT)
    assert out.raw["token_ids"] == list(llm.engine.generate(PROMPT, max_new_tokens=4).token_ids)


def _stop_string(text: str) -> tuple[str, int]:
    """A printable character of ``text`` (not its first) and where it first appears."""
    for index, char in enumerate(text):
        if index and char.isascii() and char.isprintable() and char not in text[:index]:
            return char, index
    pytest.skip(f"no usable stop character in {text!r}")


def test_stop_ends_decoding_in_the_engine(rag):
    llm = FusionRAGLLM(rag=rag, max_new_tokens=16, method="full_attention")
    full = llm.complete(PROMPT)
    assert full.raw["finish_reason"] == "length" and len(full.raw["token_ids"]) == 16
    stop, cut = _stop_string(full.text)
    stopped = llm.complete(PROMPT, stop=[stop])
    assert stopped.text == full.text[:cut]
    assert stopped.raw["finish_reason"] == "stop" and len(stopped.raw["token_ids"]) < 16
    streamed = list(llm.stream_complete(PROMPT, stop=stop))
    assert "".join(r.delta for r in streamed) == stopped.text and streamed[-1].raw["finish_reason"] == "stop"
    assert asyncio.run(llm.acomplete(PROMPT, stop=[stop])).text == stopped.text
    by_default = FusionRAGLLM(rag=rag, max_new_tokens=16, generate_kwargs={"method": "full_attention", "stop": [stop]})
    assert by_default.complete(PROMPT).text == stopped.text
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['typical_p'\]"):
        llm.complete(PROMPT, stop=[stop], typical_p=0.5)


def test_system_prompt_is_the_chats_system_message(rag):
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    direct = rag.generate(chat, max_new_tokens=4)
    plain = FusionRAGLLM(rag=rag, max_new_tokens=4).complete(PROMPT)
    llm = FusionRAGLLM(rag=rag, max_new_tokens=4, system_prompt=SYSTEM)
    out = llm.complete(PROMPT)
    assert out.raw["token_ids"] == list(direct.token_ids)
    assert out.raw["stats"]["prompt_tokens"] == direct.stats.prompt_tokens > plain.raw["stats"]["prompt_tokens"]
    streamed = list(llm.stream_complete(PROMPT))
    assert streamed[-1].raw["token_ids"] == list(direct.token_ids)
    # formatted prompts go as they are (LlamaIndex's predict has already put the system prompt in)
    assert llm.complete(PROMPT, formatted=True).raw["token_ids"] == plain.raw["token_ids"]


@pytest.mark.parametrize("is_chat_model", [False, True])
def test_predict_sends_the_system_prompt_as_llama_index_does(rag, is_chat_model):
    """As a completion model the system prompt is prepended to the text; as a chat model it is a system message."""
    llm = FusionRAGLLM(rag=rag, max_new_tokens=4, system_prompt=SYSTEM, is_chat_model=is_chat_model)
    answer = llm.predict(PromptTemplate("Say {word}"), word="hi")
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    direct = rag.generate(chat if is_chat_model else f"{SYSTEM}\n\n{PROMPT}", max_new_tokens=4)
    assert answer == direct.text
