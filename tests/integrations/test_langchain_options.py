"""LangChain adapters' constructor arguments: other ecosystems' spellings map to fields, the rest is refused by name."""

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.rate_limiters import InMemoryRateLimiter
from pydantic import BaseModel

from fusionrag_llm import get_method
from fusionrag_llm.integrations import _shared
from fusionrag_llm.integrations.langchain import ChatFusionRAG, FusionRAGLLMLangChain

MODELS = [ChatFusionRAG, FusionRAGLLMLangChain]


@pytest.fixture(params=MODELS, ids=lambda model: model.__name__)
def model_class(request):
    return request.param


@pytest.mark.parametrize("name", ["foo_bar", "recompute_ration", "top_pp", "num_predicts"])
def test_an_unknown_argument_raises_naming_it_and_listing_the_accepted_ones(rag, model_class, name):
    with pytest.raises(ValueError, match=rf"unknown argument '{name}'.*Accepted: .*max_tokens, .*recompute_ratio"):
        model_class(rag=rag, **{name: 0.5})


@pytest.mark.parametrize("typo, meant", [("recompute_ration", "recompute_ratio"), ("max_token", "max_tokens"),
                                         ("methd", "method")])  # fmt: skip
def test_a_typo_raises_with_the_argument_it_resembles(rag, model_class, typo, meant):
    with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
        model_class(rag=rag, **{typo: 1})


@pytest.mark.parametrize("name, value, field, expected", [
    ("max_tokens", 5, "max_tokens", 5),
    ("max_new_tokens", 5, "max_tokens", 5),
    ("num_predict", 6, "max_tokens", 6),
    ("max_completion_tokens", 7, "max_tokens", 7),
    ("stop", ["\n"], "stop", ["\n"]),
    ("stop_sequences", ["END"], "stop", ["END"]),
    ("temperature", 0, "temperature", 0),
    ("temperature", None, "temperature", None),
    ("temperature", 0.7, "temperature", 0.7),
    ("top_p", 0.9, "top_p", 0.9),
    ("top_k", 40, "top_k", 40),
    ("min_p", 0.05, "min_p", 0.05),
    ("repetition_penalty", 1.1, "repetition_penalty", 1.1),
    ("repeat_penalty", 1.1, "repetition_penalty", 1.1),
    ("frequency_penalty", 0.5, "frequency_penalty", 0.5),
    ("presence_penalty", -0.5, "presence_penalty", -0.5),
    ("do_sample", False, "do_sample", False),
    ("seed", 7, "seed", 7),
    ("method_options", {"kv_shift": 0.2}, "method_options", {"kv_shift": 0.2}),
    ("recompute_ratio", 0.3, "recompute_ratio", 0.3),
    ("recompute_ratio", None, "recompute_ratio", None),
    ("timeout", 60, "timeout", 60),
    ("request_timeout", 30, "timeout", 30),
    ("max_retries", 2, "max_retries", 2),
    ("tags", ["a"], "tags", ["a"]),
    ("verbose", True, "verbose", True),
    ("name", "mine", "name", "mine"),
])  # fmt: skip
def test_each_spelling_sets_its_field(rag, model_class, name, value, field, expected):
    assert getattr(model_class(rag=rag, **{name: value}), field) == expected


@pytest.mark.parametrize("name", ["model", "model_id", "model_name"])
def test_the_model_spellings_name_the_model_to_load_and_load_nothing(model_class, name):
    loaded = _shared._load_by_name.cache_info().currsize
    assert model_class(**{name: "tiny"}).model_name == "tiny"
    assert _shared._load_by_name.cache_info().currsize == loaded


def test_an_engine_names_the_model(rag, model_class):
    assert model_class(rag=rag).model_name == rag.model_name


def test_langchains_standard_fields_are_kept(rag, model_class):
    callback, cache, limiter = BaseCallbackHandler(), InMemoryCache(), InMemoryRateLimiter()
    model = model_class(rag=rag, callbacks=[callback], cache=cache, metadata={"k": 1}, custom_get_token_ids=list)
    assert model.callbacks == [callback] and model.cache is cache and model.metadata["k"] == 1
    assert model.get_num_tokens("four") == 4  # custom_get_token_ids still wins
    chat = ChatFusionRAG(rag=rag, rate_limiter=limiter, disable_streaming=True, streaming=True)
    assert chat.rate_limiter is limiter and chat.disable_streaming is True and chat.streaming is True


def test_a_field_given_under_two_spellings_raises(rag, model_class):
    with pytest.raises(ValueError, match="max_tokens is given twice, as 'max_tokens' and as 'num_predict'"):
        model_class(rag=rag, max_tokens=4, num_predict=8)
    with pytest.raises(ValueError, match="model_name is given twice"):
        model_class(model="tiny", model_id="other")


@pytest.mark.parametrize("name, value, reason", [
    ("n", 2, "one answer per call"),
    ("n", True, "one answer per call"),
    ("best_of", 3, "no beam search or best-of ranking"),
    ("num_beams", 4, "no beam search or best-of ranking"),
    ("typical_p", 0.9, "not a sampling setting here"),
    ("tfs_z", 0.5, "not a sampling setting here"),
    ("mirostat", 2, "not a sampling setting here"),
    ("logprobs", True, "answers carry no log-probabilities"),
    ("top_logprobs", 5, "answers carry no log-probabilities"),
    ("logit_bias", {"42": 5}, "no per-token logit bias"),
    ("num_ctx", 4096, "context window is fixed by the model"),
    ("max_length", 512, "context window is fixed by the model"),
    ("model_kwargs", {"top_p": 0.5}, "options are named arguments here"),
    ("pipeline_kwargs", {"max_new_tokens": 5}, "options are named arguments here"),
    ("base_url", "http://localhost:11434", "runs in this process"),
    ("openai_api_key", "sk-x", "runs in this process"),
    ("keep_alive", "5m", "runs in this process"),
    ("device", "cuda", "placed when it was loaded"),
    ("num_gpu", 1, "placed when it was loaded"),
    ("format", "json", "with_structured_output"),
    ("response_format", {"type": "json_object"}, "with_structured_output"),
])  # fmt: skip
def test_an_unsupported_setting_raises_with_the_reason(rag, model_class, name, value, reason):
    with pytest.raises(ValueError, match=rf"does not support {name}=.*{reason}.*\(accepted: None"):
        model_class(rag=rag, **{name: value})


@pytest.mark.parametrize("name, value", [
    ("typical_p", 1.0), ("typical_p", None), ("mirostat", 0), ("n", 1), ("best_of", 1), ("num_beams", 1),
    ("logprobs", False), ("logit_bias", {}), ("model_kwargs", {}), ("num_ctx", None),
])  # fmt: skip
def test_an_unsupported_setting_at_its_neutral_value_is_accepted(rag, model_class, name, value):
    model = model_class(rag=rag, **{name: value})
    assert not hasattr(model, name)  # a no-op: nothing is stored


def test_settings_the_engine_refuses_raise_at_construction(rag, model_class):
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a number in \[0.01, 10000\], got -0.7"):
        model_class(rag=rag, temperature=-0.7)
    with pytest.raises(ValueError, match=r"top_p must be a number in \[1e-06, 1\], got 0"):
        model_class(rag=rag, top_p=0)
    with pytest.raises(ValueError, match="do_sample=True needs a temperature > 0"):
        model_class(rag=rag, do_sample=True)
    with pytest.raises(ValueError, match="valid number"):  # True is no temperature
        model_class(rag=rag, temperature=True)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        model_class(rag=rag, num_predict=-1)  # Ollama's "until the context is full"
    with pytest.raises(ValueError, match="unknown option\\(s\\) speed for method 'fusionrag'; it takes kv_shift"):
        model_class(rag=rag, method_options={"speed": 2})
    with pytest.raises(ValueError, match="unknown method 'lego'"):
        model_class(rag=rag, method="lego")


def test_streaming_is_a_chat_model_flag():
    assert FusionRAGLLMLangChain(streaming=False).model_name
    with pytest.raises(ValueError, match=r"streaming=True: this LLM streams through \.stream\(\)"):
        FusionRAGLLMLangChain(streaming=True)


def test_an_api_key_is_taken_with_a_warning(rag, model_class):
    with pytest.warns(UserWarning, match="ignores api_key: the engine runs in this process"):
        model = model_class(rag=rag, api_key="test")  # LangChain's standard unit tests pass one
    assert not hasattr(model, "api_key")


def test_seed_and_overrides_reach_the_engine_call(rag, model_class):
    options = model_class(rag=rag, seed=3, method="a3", method_options={"decode_kv_budget": 8}, num_predict=4)._options({})
    assert (options["method"], options["max_new_tokens"]) == (get_method("a3", decode_kv_budget=8), 4)
    assert options["sampling"].seed == 3 and "seed" not in options  # the seed is the sampling's
    defaults = model_class(rag=rag)._options({})
    assert defaults["method"] == get_method("fusionrag") and defaults.get("recompute_ratio") is None  # the method's own
    assert defaults["sampling"].seed is None and defaults["sampling"].greedy  # the engine's own defaults


def test_num_predict_bounds_a_real_answer(rag):
    message = ChatFusionRAG(rag=rag, num_predict=2).invoke("Say something.")
    assert 0 < message.usage_metadata["output_tokens"] <= 2


class Answer(BaseModel):
    text: str


def test_structured_output_refuses_arguments_it_does_not_take(rag, model_class):
    with pytest.raises(ValueError, match="unsupported argument"):
        model_class(rag=rag).with_structured_output(Answer, strict=True)  # the rest: test_structured_output.py

