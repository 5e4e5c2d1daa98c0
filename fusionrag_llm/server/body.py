"""Reading a request body within limits, and the OpenAI-shaped error every refusal becomes.

A body is read in pieces and refused (413) as soon as it passes the size limit, Content-Length or
not. It must be UTF-8 JSON holding one object, nested at most ``MAX_DEPTH`` arrays and objects
deep, with integers that fit in 64 bits and finite floats (no ``NaN`` or ``Infinity``); anything
else is a 400 that says what was wrong, before pydantic sees it. Python's own parser would turn a
5000-digit integer into a ``ValueError`` and a body nested 100,000 deep into a ``RecursionError``
(both a 500 without these checks).
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from fusionrag_llm.server.protocol import error_body

MAX_BODY_BYTES = 16 * 2**20
MAX_DEPTH = 32  # arrays and objects inside each other; an OpenAI request needs about 5
INT_RANGE = (-(2**63), 2**63 - 1)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.kind, self.code), status_code=self.status)


class _Refused(ValueError):
    """A JSON value outside what the server takes (raised from inside the parser)."""


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, or a 413 as soon as it is over ``limit`` bytes."""
    too_large = ApiError(413, f"the request body is over this server's limit of {limit} bytes; send less per request")
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise too_large
    pieces, total = [], 0
    async for piece in request.stream():
        total += len(piece)
        if total > limit:
            raise too_large
        pieces.append(piece)
    return b"".join(pieces)


def parse_body(raw: bytes, model):
    """``raw`` as an instance of the pydantic ``model``; any problem is an ``ApiError`` (400)."""
    data = decode_json(raw)
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, _validation_message(exc)) from exc


def decode_json(raw: bytes) -> Any:
    """UTF-8 JSON within the limits of the module docstring."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"the request body is not UTF-8 (byte {exc.start} is invalid); send JSON in UTF-8"
        raise ApiError(400, message) from None
    try:
        data = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _Refused as exc:
        raise ApiError(400, str(exc)) from None
    except RecursionError:
        raise ApiError(400, _too_deep()) from None
    except ValueError as exc:  # json.JSONDecodeError among them
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if _depth(data) > MAX_DEPTH:
        raise ApiError(400, _too_deep())
    return data


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    value = int(text) if digits <= 20 else None
    if value is None or not INT_RANGE[0] <= value <= INT_RANGE[1]:
        raise _Refused(f"an integer in the request body is out of range ({digits} digits): integers must lie in "
                       f"[{INT_RANGE[0]}, {INT_RANGE[1]}]")  # fmt: skip
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"a number in the request body is too large for a float ({text[:40]}); send a finite number")
    return value


def _constant(name: str):
    raise _Refused(f"{name} is not a JSON number; send a finite number")


def _depth(data: Any) -> int:
    """How many arrays and objects ``data`` nests, counted without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _too_deep() -> str:
    return f"the request body is nested too deeply: at most {MAX_DEPTH} levels of arrays and objects are allowed"


def _validation_message(exc: ValidationError) -> str:
    problems = [f"{'.'.join(map(str, error['loc'])) or 'body'}: {error['msg']}" for error in exc.errors()[:5]]
    return "invalid request: " + "; ".join(problems)
