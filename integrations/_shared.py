"""What both adapters need: the engine behind a name or instance, call options, chunk registration.

Framework-free on purpose, so importing it pulls in neither LlamaIndex nor LangChain.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import logging
import threading
import uuid
import weakref
from typing import Any, AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence, TypeVar

from fusionrag_llm import (ChatRequest, EmbeddingModel, FusionRAG, IngestReport, SamplingParams, check_tenant, get_method,
                           tool_calls)  # fmt: skip

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m"
RUN_OPTIONS = ("method", "recompute_ratio", "method_options")  # the method, its ratio and its own options
# SamplingParams' knobs the adapters take by name (its seed is the call's seed; do_sample is transformers')
SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
                    "presence_penalty", "do_sample")  # fmt: skip
CALL_OPTIONS = (*RUN_OPTIONS[:2], "max_new_tokens", *RUN_OPTIONS[2:], "seed", *SAMPLING_OPTIONS, "reproducible",
                "json_schema")  # fmt: skip
SAMPLING_SPELLINGS = {"repeat_penalty": "repetition_penalty"}  # Ollama's and llama.cpp's name
# None: not given (the setting, else the engine's default; the ratio: the method's own)
_NONE_IS_UNSET = (*SAMPLING_OPTIONS, "seed", "recompute_ratio", "method_options", "reproducible", "json_schema")

T = TypeVar("T")
_ITEM, _END, _ERROR = range(3)

_sessions: "weakref.WeakKeyDictionary[FusionRAG, str]" = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


@functools.lru_cache(maxsize=4)
def _load_by_name(name: str) -> FusionRAG:
    logger.info("loading model %r for a framework adapter", name)
    return FusionRAG.from_pretrained(name)


def resolve_rag(rag: FusionRAG | None, model_name: str) -> FusionRAG:
    """The given engine, else the process-wide engine loaded (once) for ``model_name``.

    Adapters built from the same model name share one engine, hence its registered chunks.
    """
    return rag if rag is not None else _load_by_name(model_name)


def check_rag(value: Any) -> FusionRAG | None:
    if value is not None and not isinstance(value, FusionRAG):
        raise ValueError(f"rag must be a FusionRAG instance or None, got {type(value).__name__}")
    return value


def check_run(options: Mapping[str, Any]) -> Any:
    """The method the run knobs in ``options`` name, checked by the engine (method, its options, ratio).

    It raises ``FusionRAGError``, a ``ValueError``, which is what the frameworks' validators expect.
    """
    extra = options.get("method_options") or {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"method_options must be a mapping of the method's options, got {type(extra).__name__}")
    method = get_method(options.get("method", "fusionrag"), **extra)
    method.check_ratio(options.get("recompute_ratio"))
    return method


def check_max_new_tokens(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {value!r}")
    return value


def call_options(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``rag.generate``: the adapter's settings updated by per-call ones, the sampling
    knobs gathered into ``sampling``. A sampling knob or ``seed`` given as None keeps the setting."""
    overrides = respell(overrides)
    unknown = sorted(set(overrides) - set(CALL_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; per-call options: {', '.join(CALL_OPTIONS)}")
    given = {name: value for name, value in overrides.items() if value is not None or name not in _NONE_IS_UNSET}
    options = {name: value for name, value in {**defaults, **given}.items()
               if value is not None or name not in _NONE_IS_UNSET}  # fmt: skip
    options["method"] = check_run(options)
    options.pop("method_options", None)
    check_max_new_tokens(options["max_new_tokens"])
    knobs = {name: options.pop(name) for name in (*SAMPLING_OPTIONS, "json_schema") if name in options}
    seed = options.pop("seed", None)
    return {**options, "sampling": sampling_params(knobs, seed)}


def sampling_params(knobs: Mapping[str, Any], seed: int | None) -> SamplingParams:
    """The engine's sampling for ``knobs`` (``SAMPLING_OPTIONS``), seeded by the call's ``seed``.

    ``do_sample=False`` decodes
    greedily whatever the temperature (as in transformers); ``do_sample=True`` needs a temperature > 0.
    Bad values raise the engine's ``FusionRAGError`` (a ``ValueError``) naming the allowed range.
    """
    knobs = dict(knobs)
    do_sample = knobs.pop("do_sample", None)
    params = SamplingParams(**knobs, seed=seed)
    if do_sample is None:
        return params
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r:.40}")
    if not do_sample:
        return dataclasses.replace(params, temperature=0.0)
    if params.greedy:
        raise ValueError("do_sample=True needs a temperature > 0 to sample with (temperature 0 decodes greedily); "
                         "set temperature, e.g. temperature=0.7")  # fmt: skip
    return params


def respell(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with other libraries' names of sampling knobs (``repeat_penalty``) mapped to the engine's."""
    respelled: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field -> the name it was given as
    for name, value in options.items():
        field = SAMPLING_SPELLINGS.get(name, name)
        if field in spelled:
            raise ValueError(f"{field} is given twice, as {spelled[field]!r} and as {name!r}; give it once")
        respelled[field], spelled[field] = value, name
    return respelled


def engine_session(rag: FusionRAG) -> str:
    """A random id per engine instance (its chunk catalog lives in memory, so caches must tell engines apart)."""
    with _registry_lock:
        return _sessions.setdefault(rag, uuid.uuid4().hex)


def checked_tenant(value: Any) -> str | None:
    """An adapter's ``tenant`` setting checked by the engine (None or ``""``: the default tenant)."""
    return check_tenant(value) or None


def for_tenant(request: Any, tenant: str | None, tools: Any = None) -> Any:
    """``request`` (a prompt string or chat messages) as the engine answers it for ``tenant``: only that
    tenant's registered chunks are found in it and only its cached KV is reused; with ``tools`` (a
    ``tool_calls.ToolPlan``) offered. The default tenant's request without tools is sent unchanged."""
    if isinstance(request, ChatRequest):
        return request
    return ChatRequest(request, tenant=tenant, tools=tools) if tenant or tools is not None else request


def tool_plan(kwargs: dict, engine: Callable[[], FusionRAG]) -> tool_calls.ToolPlan | None:
    """Takes ``tools`` and ``tool_choice`` out of a call's options: the request's tools in the chat template's
    own format where it has one (else the generic prompt), the answer constrained to them (``kwargs`` gains
    their JSON schema); None without tools. ``engine``: the adapter's engine, asked for only with tools."""
    tools, choice = kwargs.pop("tools", None), kwargs.pop("tool_choice", None)
    if tools is None:
        return None
    plan = tool_calls.ToolPlan.of(tools, choice, engine().tokenizer.tool_format)
    if plan.schema is not None:
        kwargs["json_schema"] = plan.schema
    return plan


def embedding_model_name(value: str) -> str:
    """An embedding adapter's ``model_name``, checked now (a clear error); the weights load on first use."""
    EmbeddingModel.resolve(value)
    return value


async def iterate_in_thread(open_iterator: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """The items of a blocking iterator, produced on a worker thread and handed to the loop as they come.

    ``open_iterator`` runs on the worker too (opening an engine stream prefills). When the consumer
    stops early (``break``, cancellation, ``aclose``), the worker stops at its next item and closes
    the iterator, so an abandoned stream leaves the engine's batch instead of decoding on.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()  # unbounded: the worker never waits for the consumer
    abandoned = threading.Event()

    def hand_over(kind: int, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody will read on
            abandoned.set()

    def work() -> None:
        try:
            iterator = open_iterator()
            try:
                for item in iterator:
                    if abandoned.is_set():
                        break
                    hand_over(_ITEM, item)
            finally:
                if hasattr(iterator, "close"):
                    iterator.close()
        except BaseException as error:  # raised again on the loop, in the consumer
            hand_over(_ERROR, error)
        else:
            hand_over(_END, None)

    loop.run_in_executor(None, work)
    try:
        while True:
            kind, value = await queue.get()
            if kind == _END:
                return
            if kind == _ERROR:
                raise value
            yield value
    finally:
        abandoned.set()


def count_chat_tokens(rag: FusionRAG, messages: list[dict[str, str]]) -> int:
    """Tokens the model reads for ``messages``: chat template, contents and the generation prompt.

    A complete chat (ending with a user message) is counted as the engine splits it; any other list
    (``trim_messages`` counts partial and reversed ones) through the same template, without checks.
    """
    if not messages:
        return 0
    if messages[-1]["role"] == "user" and messages[-1]["content"].strip():
        with rag.engine.lock:  # the chunk catalog it reads may be growing on another thread
            return sum(len(segment.token_ids) for segment in rag.segments(messages))
    body, generation_prompt = rag.tokenizer.split_generation_prompt(messages)
    return sum(len(_part_ids(rag, part)) for part in [*body, *generation_prompt])


def count_prompt_tokens(rag: FusionRAG, prompt: str) -> int:
    """Tokens the model reads for a flat prompt (sent as the chat template's user message)."""
    if not prompt.strip():
        return 0
    with rag.engine.lock:
        return sum(len(segment.token_ids) for segment in rag.segments(prompt))


def _part_ids(rag: FusionRAG, part) -> list[int]:
    """Template text with its control tokens; message contents as data."""
    return rag.tokenizer.encode_template(part.text) if part.message is None else rag.tokenizer.encode(part.text)


def finish_reason(token_ids: Sequence[int], max_new_tokens: int) -> str:
    return "length" if len(token_ids) >= max_new_tokens else "stop"


def register_texts(rag: FusionRAG, texts: Sequence[str], embeddings=None, fuse: bool = True,
                   neighbors: int = 10, progress: bool = False, tenant: str | None = None) -> IngestReport:  # fmt: skip
    """Register texts exactly as frameworks put them in prompts (stripped); empty texts are skipped.

    Frameworks strip retrieved texts before joining them, and a stripped text is also found inside
    an unstripped one, so the stripped form is what gets registered. ``tenant``: registered for that
    tenant's requests only (None: the default tenant).
    """
    keep = [index for index, text in enumerate(texts) if text.strip()]
    if len(keep) < len(texts):
        logger.debug("skipping %d empty texts", len(texts) - len(keep))
    if not keep:
        return IngestReport(chunk_ids=[])
    vectors = [embeddings[index] for index in keep] if embeddings is not None else None
    return rag.add_chunks([texts[index].strip() for index in keep], fuse=fuse, neighbors=neighbors, embeddings=vectors,
                          progress=progress, tenant=tenant)  # fmt: skip


def map_arguments(owner: str, data: Mapping[str, Any], fields: Collection[str], spellings: Mapping[str, str],
                  other: Callable[[str, Any], bool] | None = None) -> dict[str, Any]:  # fmt: skip
    """Constructor arguments by field: other libraries' ``spellings`` mapped to ``fields``, a field given
    twice refused. A name that is no field goes to ``other`` (True: taken as a no-op; it raises to
    refuse); otherwise it is an unknown argument, named with the closest accepted one."""
    arguments: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field -> the spelling it was given as
    for name, value in data.items():
        field = spellings.get(name, name)
        if field in spelled:
            raise ValueError(f"{field} is given twice, as {spelled[field]!r} and as {name!r}; give it once")
        if field in fields:
            arguments[field], spelled[field] = value, name
        elif other is None or not other(name, value):
            accepted = sorted({*fields, *spellings})
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise ValueError(f"{owner} got an unknown argument {name!r}{hint} Accepted: {', '.join(accepted)}")
    return arguments
