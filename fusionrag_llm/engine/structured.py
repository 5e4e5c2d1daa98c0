"""JSON output by construction: a per-request grammar masks the tokens that cannot continue valid JSON.

``SamplingParams.json_schema`` (True: any JSON object; a JSON schema as a dict or its text: JSON that
validates against it) gives the request a ``JSONConstraint``: before each token is chosen, every
token the grammar does not allow next gets a logit of -inf (greedy, sampling and penalties alike
choose among the allowed ones), and the chosen token advances the grammar. Once the value is
complete only the model's end tokens remain, so the answer ends there ("stop"); ``max_new_tokens``
reached first leaves it unfinished ("length"), as OpenAI's API does. Tokens holding a control
character (a byte below 0x20) are never allowed: the grammar engine lets them into strings, where
JSON forbids them unescaped, and the output needs no whitespace but spaces.

The grammar engine is xgrammar (the ``structured`` extra), chosen by measurement on this project's
CPU with SmolLM2's 49,152-token vocabulary: about 0.4 ms a token (its worst of 30 tokens: 2.3 ms;
llguidance 0.2 ms typical but 4.5 s for its first token) against about 16 ms of a decode step, a
compiled schema in 8 ms, batch masks, Apache-2.0, wheels for CPU and CUDA machines. Compiled
grammars are kept per tokenizer and schema text.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from typing import Any

import torch

from fusionrag_llm.errors import FusionRAGError, require

ANY_JSON_OBJECT = True
_COMPILED_KEPT = 64  # schemas compiled per tokenizer, least recently used dropped


def check_json_schema(value: Any) -> str | bool | None:
    """``value`` as kept in ``SamplingParams``: None (free text), True (any JSON object) or a schema's
    canonical JSON text; anything else is a ``FusionRAGError`` saying what is allowed."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise FusionRAGError(f"json_schema is a string that is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise FusionRAGError("json_schema must be None, True (any JSON object) or a JSON schema (a dict or its JSON "
                             f"text), got {type(value).__name__}")  # fmt: skip
    return json.dumps(value, separators=(",", ":"))  # properties keep their order: the answer's order


class _Grammars:
    """One tokenizer's grammar compiler and its compiled schemas (xgrammar)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_ids: frozenset[int]):
        self.xgr = require("xgrammar", "structured", "JSON output (json_schema / response_format)")
        info = self.xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=sorted(stop_ids))  # fmt: skip
        self.compiler = self.xgr.GrammarCompiler(info)
        self.vocab_size = vocab_size
        control = torch.zeros(vocab_size, dtype=torch.bool)  # tokens with a byte below 0x20 in their text
        for index, token in enumerate(info.decoded_vocab[:vocab_size]):
            control[index] = index not in stop_ids and any(byte < 0x20 for byte in token)
        self.control = control
        self._compiled: OrderedDict[str | bool, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compiled(self, schema: str | bool) -> Any:
        with self._lock:
            if schema in self._compiled:
                self._compiled.move_to_end(schema)
                return self._compiled[schema]
        try:
            grammar = (self.compiler.compile_builtin_json_grammar() if schema is True
                       else self.compiler.compile_json_schema(schema, any_whitespace=False))  # fmt: skip
        except Exception as exc:  # the library's own error type: the schema is what it cannot take
            raise FusionRAGError(f"json_schema cannot be compiled into a grammar: {exc}") from None
        with self._lock:
            self._compiled[schema] = grammar
            while len(self._compiled) > _COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return grammar


# per tokenizer object, dropped with it (an id() could be reused by another tokenizer after it is gone)
_BY_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_TOKENIZER_LOCK = threading.Lock()


def json_constraint(tokenizer: Any, vocab_size: int, schema: str | bool) -> "JSONConstraint":
    """A fresh constraint for one answer under ``schema`` (``check_json_schema``'s form)."""
    with _BY_TOKENIZER_LOCK:
        grammars = _BY_TOKENIZER.get(tokenizer.hf)
        if grammars is None or grammars.vocab_size != vocab_size:
            grammars = _BY_TOKENIZER[tokenizer.hf] = _Grammars(tokenizer.hf, vocab_size, tokenizer.stop_ids)
    return JSONConstraint(grammars, grammars.compiled(schema))


class JSONConstraint:
    """One answer's grammar state: ``restrict`` a logit row, then ``accept`` the token chosen."""

    def __init__(self, grammars: _Grammars, compiled: Any):
        self._xgr = grammars.xgr
        self._matcher = grammars.xgr.GrammarMatcher(compiled)
        self._mask = grammars.xgr.allocate_token_bitmask(1, grammars.vocab_size)
        self._grammars, self._compiled = grammars, compiled

    def fresh(self) -> "JSONConstraint":
        """The same constraint at its start (another answer to the same prompt)."""
        return JSONConstraint(self._grammars, self._compiled)

    def restrict(self, row: torch.Tensor) -> torch.Tensor:
        """``row`` ([vocab] logits, float32) with every token the grammar does not allow next at -inf."""
        self._matcher.fill_next_token_bitmask(self._mask)
        row = row.clone()
        mask = self._mask.to(row.device) if row.device.type != "cpu" else self._mask
        self._xgr.apply_token_bitmask_inplace(row[None], mask)
        control = self._grammars.control
        row[: len(control)].masked_fill_(control.to(row.device), float("-inf"))
        return row

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise FusionRAGError(f"token {token} does not continue the JSON the request asked for")
