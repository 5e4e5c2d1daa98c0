"""JSON output by construction (``SamplingParams.json_schema``): every answer of the random-weight model
parses and validates against its schema, greedy or sampled, batched with free-text requests, for
each of n answers; a bad schema is a clear error before anything runs."""

import json

import pytest

from fusionrag_llm import FusionRAG, FusionRAGError, SamplingParams

pytest.importorskip("xgrammar", reason="JSON output needs the structured extra")
jsonschema = pytest.importorskip("jsonschema", reason="the checks validate with jsonschema (the test extra)")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tag"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9},
                         "tag": {"enum": ["red", "green"]}}}  # fmt: skip


@pytest.fixture(scope="module")
def rag():
    return FusionRAG.from_pretrained("tiny", store=":memory:")


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "repetition_penalty": 1.3}])
def test_answers_validate_against_the_schema(rag, sampling):
    for prompt in ("Give me JSON", "Describe the lighthouse", "{"):
        out = rag.generate(prompt, method="full_attention", max_new_tokens=48, sampling={**sampling, "json_schema": SCHEMA})
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_any_json_object_and_free_text_in_one_batch(rag):
    free = rag.generate("Say hi", method="full_attention", max_new_tokens=8)
    schema = SamplingParams(json_schema=SCHEMA)
    outs = [rag.generate("Say hi", method="full_attention", max_new_tokens=48, sampling=schema, n=3)]
    batch = rag.generate_many(["Say hi", "Give me JSON"], method="full_attention", max_new_tokens=48,
                              sampling={"json_schema": SCHEMA})  # fmt: skip
    alone = rag.generate_many(["Say hi"], method="full_attention", max_new_tokens=8)
    assert alone[0].token_ids == free.token_ids  # a constraint is per request: free text is unchanged
    for out in [*outs, *outs[0].others, *batch]:
        jsonschema.validate(json.loads(out.text), SCHEMA)
    anything = rag.generate("Say hi", method="full_attention", max_new_tokens=16, sampling={"json_schema": True})
    assert anything.text.startswith("{")  # any JSON object: it starts as one (16 tokens may not end it)


@pytest.mark.parametrize("bad, words", [
    ("{not json", "not JSON"), (["a"], "must be None, True"), ({"type": "object", "properties": 3}, "cannot be compiled"),
])  # fmt: skip
def test_a_bad_schema_is_refused_clearly(rag, bad, words):
    with pytest.raises(FusionRAGError, match=words):
        rag.generate("Say hi", max_new_tokens=4, sampling={"json_schema": bad})
