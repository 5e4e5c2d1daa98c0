"""Constructor arguments of the LangChain adapters: other libraries' spellings, refusals with reasons.

Framework-free (no LangChain import), so the tables can be read and tested on their own. Users of
ChatOpenAI, langchain-huggingface and langchain-ollama bring their spellings (``model``,
``num_predict``, ``repeat_penalty``, ...): a spelling with a meaning here is mapped to the field, a
setting with a meaning elsewhere but not here is refused with the reason (its neutral value is
accepted and does nothing), and anything else is an unknown argument, with the closest accepted name.
"""

from __future__ import annotations

import warnings
from typing import Any

from fusionrag_llm.integrations._shared import SAMPLING_OPTIONS, SAMPLING_SPELLINGS, map_arguments

# What ChatOpenAI, langchain-huggingface and langchain-ollama users write for a field here.
_SPELLINGS = {"model": "model_name", "model_id": "model_name", "max_new_tokens": "max_tokens",
              "num_predict": "max_tokens", "max_completion_tokens": "max_tokens", "stop_sequences": "stop",
              "request_timeout": "timeout", **SAMPLING_SPELLINGS}  # fmt: skip

_ONE = "one answer per call; call again (unseeded, or with another seed) for another"
_SEARCH = "no beam search or best-of ranking: each answer is one greedy or sampled sequence"
_FILTERS = "not a sampling setting here (those are temperature, top_p, top_k, min_p, the three penalties and seed)"
_LOGPROBS = "answers carry no log-probabilities"
_BIAS = "no per-token logit bias"
_LOCAL = "the engine runs in this process: no API, server or credentials"
_PLACED = "the engine was placed when it was loaded; pass a loaded FusionRAG engine as rag="
_CONTEXT = "the context window is fixed by the model; max_tokens sets the answer's length"
_BAG = ("options are named arguments here (method, recompute_ratio, max_tokens, stop, seed, temperature, top_p, "
        "top_k, min_p, the penalties, method_options)")  # fmt: skip
_SCHEMA = ("JSON output is asked for here with with_structured_output(schema), or with json_schema= per call or in "
           "bind: a JSON schema, or True for any JSON object")  # fmt: skip
# Settings with a meaning elsewhere but not here: (neutral values, accepted as no-ops; why the rest is refused).
_UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    **dict.fromkeys(("typical_p", "tfs_z"), ((None, 1.0), _FILTERS)),
    "mirostat": ((None, 0), _FILTERS),
    "n": ((None, 1), _ONE),
    **dict.fromkeys(("best_of", "num_beams"), ((None, 1), _SEARCH)),
    "logprobs": ((None, False), _LOGPROBS),
    "top_logprobs": ((None,), _LOGPROBS),
    "logit_bias": ((None, {}), _BIAS),
    **dict.fromkeys(("num_ctx", "n_ctx", "context_window", "max_length"), ((None,), _CONTEXT)),
    **dict.fromkeys(("openai_api_key", "base_url", "openai_api_base", "organization", "openai_proxy",
                     "endpoint_url", "huggingfacehub_api_token", "http_client", "default_headers", "keep_alive"),
                    ((None,), _LOCAL)),  # fmt: skip
    **dict.fromkeys(("device", "device_map", "num_gpu", "num_thread"), ((None,), _PLACED)),
    **dict.fromkeys(("model_kwargs", "pipeline_kwargs", "extra_body"), ((None, {}), _BAG)),
    **dict.fromkeys(("format", "response_format"), ((None,), _SCHEMA)),
    "streaming": ((None, False), "this LLM streams through .stream() and .astream(); the flag is ChatFusionRAG's"),
}

# LangChain's standard unit tests pass an api_key to every chat model: taken, unused, with a warning
_IGNORED = {"api_key": _LOCAL}

# Per call (invoke keyword arguments, bind): these options, with the spellings of max_tokens and the sampling knobs.
_CALL_FIELDS = ("max_tokens", "method", "recompute_ratio", "method_options", "seed", *SAMPLING_OPTIONS, "reproducible",
                "json_schema")  # fmt: skip
_CALL_SPELLINGS = {name: field for name, field in _SPELLINGS.items() if field in _CALL_FIELDS}


def constructor_arguments(model: type, data: dict, fields: set[str]) -> dict[str, Any]:
    """``data`` with spellings mapped to ``fields``; unsupported or unknown arguments raise ``ValueError``."""
    return map_arguments(model.__name__, data, fields, _SPELLINGS, lambda name, value: _not_a_field(model, name, value))


def call_arguments(model: type, kwargs: dict) -> dict[str, Any]:
    """Per-call options (``invoke(..., num_predict=8)``, ``bind(max_new_tokens=8)``) by field, checked as the
    constructor checks its arguments: ``max_new_tokens``/``num_predict``/``max_completion_tokens`` mean
    ``max_tokens``, ``repeat_penalty`` means ``repetition_penalty``; settings with no meaning here raise
    saying why; other names raise with the closest accepted one."""
    owner = f"{model.__name__} (per call)"
    return map_arguments(owner, kwargs, _CALL_FIELDS, _CALL_SPELLINGS, lambda name, value: _not_a_field(model, name, value))


def _not_a_field(model: type, name: str, value: Any) -> bool:
    """Whether ``name`` is taken as a no-op (its neutral value, or ignored with a warning); else raises."""
    if name in _UNSUPPORTED:
        _check_neutral(model, name, value)
        return True
    if name in _IGNORED:
        if value is not None:
            warnings.warn(f"{model.__name__} ignores {name}: {_IGNORED[name]}", UserWarning, stacklevel=6)
        return True
    return False


def _check_neutral(model: type, name: str, value: Any) -> None:
    neutral, reason = _UNSUPPORTED[name]
    if not any(value is accepted or (value == accepted and type(value) is not bool) for accepted in neutral):
        shown = " or ".join(repr(accepted) for accepted in neutral)
        raise ValueError(f"{model.__name__} does not support {name}={value!r}: {reason} (accepted: {shown})")
