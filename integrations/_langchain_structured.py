"""LangChain's ``with_structured_output`` over the engine's JSON output (``SamplingParams.json_schema``):
the model is bound to a schema, so its answer is JSON that validates against it by construction, and
a parser turns it into the schema's type (a pydantic model's instance, else a dict)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema
from pydantic import BaseModel

METHODS = ("json_schema", "json_mode")


def structured(model: Runnable, schema: Any, method: str, include_raw: bool) -> Runnable:
    """``model`` bound to answer as ``schema`` asks (``method``: ``json_schema``, or ``json_mode`` for any
    JSON object), then parsed; ``include_raw``: ``{"raw", "parsed", "parsing_error"}`` instead."""
    if method == "function_calling":
        raise ValueError("method='function_calling' is not supported by FusionRAG models; use method='json_schema' "
                         "(the default: the answer is constrained to the schema) or 'json_mode'")  # fmt: skip
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} for with_structured_output; allowed: {', '.join(METHODS)}")
    if method == "json_schema" and schema is None:
        raise ValueError("method='json_schema' needs a schema: a pydantic model, a TypedDict or a JSON schema dict")
    pydantic = isinstance(schema, type) and issubclass(schema, BaseModel)
    bound = model.bind(json_schema=True if method == "json_mode" else convert_to_json_schema(schema))
    parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
    if not include_raw:
        return bound | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=bound) | parsed.with_fallbacks([failed], exception_key="parsing_error")
