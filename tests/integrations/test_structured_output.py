"""Structured output through the frameworks, on the random-weight model: LangChain's
``with_structured_output`` (json_schema, json_mode, include_raw) and LlamaIndex's ``structured_predict``
return the schema's type, because decoding is constrained to it."""

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG, FusionRAGLLMLangChain

pytest.importorskip("xgrammar", reason="structured output needs the structured extra")


class Pick(BaseModel):
    """A city and how sure the answer is."""

    city: Literal["Quennel", "Brightwater"]
    sure: bool
    rank: int = Field(ge=1, le=3)


@pytest.fixture(scope="module")
def rag():
    return FusionRAG.from_pretrained("tiny", store=":memory:")


@pytest.mark.parametrize("model_class", [ChatFusionRAG, FusionRAGLLMLangChain])
def test_langchain_with_structured_output(rag, model_class):
    model = model_class(rag=rag, max_tokens=80)
    pick = model.with_structured_output(Pick).invoke("Which city?")
    assert isinstance(pick, Pick)
    as_dict = model.with_structured_output(Pick.model_json_schema()).invoke("Which city?")
    assert Pick.model_validate(as_dict) == pick  # the same constraint from the schema's dict
    raw = model.with_structured_output(Pick, include_raw=True).invoke("Which city?")
    assert raw["parsed"] == pick and raw["parsing_error"] is None and raw["raw"] is not None
    cut = model_class(rag=rag, max_tokens=3).with_structured_output(Pick, include_raw=True).invoke("Which city?")
    assert cut["parsed"] is None and cut["parsing_error"] is not None  # 3 tokens: unfinished JSON, said so
    loose = model_class(rag=rag, max_tokens=4).with_structured_output(None, method="json_mode", include_raw=True)
    answer = loose.invoke("Any JSON")["raw"]  # a message from the chat model, a string from the LLM
    assert (answer.content if model_class is ChatFusionRAG else answer).startswith("{")
    for bad, words in [({"method": "function_calling"}, "not supported"), ({"method": "xml"}, "allowed: json_schema")]:
        with pytest.raises(ValueError, match=words):
            model.with_structured_output(Pick, **bad)


def test_llama_index_structured_predict_and_structured_llm(rag):
    import asyncio

    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate

    from fusionrag_llm.integrations.llama_index import FusionRAGLLM

    llm = FusionRAGLLM(rag=rag, max_new_tokens=80)
    prompt = PromptTemplate("Which city is named in: {text}?")
    pick = llm.structured_predict(Pick, prompt, text="a note about Quennel")
    assert isinstance(pick, Pick)
    assert asyncio.run(llm.astructured_predict(Pick, prompt, text="a note about Quennel")) == pick
    streamed = list(llm.stream_structured_predict(Pick, prompt, text="a note about Quennel"))
    assert Pick.model_validate(streamed[-1].model_dump()) == pick
    reply = llm.as_structured_llm(Pick).chat([ChatMessage(role="user", content="Which city is named in: a note?")])
    assert isinstance(reply.raw, Pick)


def test_the_extraction_cookbook_runs_and_every_answer_validates(tmp_path):
    import json
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "cookbook" / "structured_extraction.py"
    out = tmp_path / "extraction.json"
    summary = runpy.run_path(str(script), run_name="cookbook")["main"](["--model", "tiny", "--count", "3", "--out", str(out)])
    assert summary["valid_json"] == summary["texts"] == 3  # random weights, valid JSON all the same
    assert json.loads(out.read_text())["summary"] == summary


@pytest.mark.real_model
def test_the_default_model_extracts_valid_json(smollm2_rag):
    chat = ChatFusionRAG(rag=smollm2_rag, max_tokens=160)
    extract = chat.with_structured_output(Pick)
    pick = extract.invoke("Text: Brightwater came second, and we are sure of it. Which city, rank, and are we sure?")
    assert isinstance(pick, Pick)
