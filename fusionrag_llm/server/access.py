"""Who may call the server: API keys, and who may register chunks (``POST /v1/chunks``).

With API keys, every route but ``/health`` needs ``Authorization: Bearer KEY`` with one of them (what
the OpenAI client sends for its ``api_key``); otherwise the answer is a 401 in OpenAI's shape, code
``invalid_api_key``. Keys are compared by their SHA-256 digests with ``hmac.compare_digest``, every
key each time, so the time taken says nothing about how much of a key was right.

A key may be bound to a tenant (``{"sk-acme": "acme"}``; ``--api-key tenant:acme=sk-acme``): every
request it authorizes is served for that tenant, and one that names another is refused (403). Unbound
keys serve the tenant the request names (``server/tenants.py``).

Chunk writes are open (whoever may call the server may register chunks), off (a 403 saying so), or
held by a chunks key: then only that key may register chunks (another valid key gets a 403), and the
chunks key is accepted on every other route too. The check runs before the route, on the raw ASGI
request, so it also covers unknown routes and FastAPI's own pages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.request import check_tenant
from fusionrag_llm.server.protocol import error_body

OPEN_PATHS = frozenset({"/health"})
CHUNKS_PATH = "/v1/chunks"


@dataclass(frozen=True)
class Access:
    """``api_keys``: keys that may call the server (none: anyone may); ``tenants``: the tenant each
    bound key serves (``bound_tenant``). ``chunk_writes``: True (open to whoever may call), False
    (off) or a key, the only one that may register chunks.

    >>> access = Access.of({"sk-team": None, "sk-acme": "acme"}, "sk-admin")
    >>> access.chunk_writes, access.bound_tenant(b"Bearer sk-acme"), access.bound_tenant(b"Bearer sk-team")
    ('sk-admin', 'acme', None)
    """

    api_keys: tuple[str, ...] = ()
    chunk_writes: bool | str = True
    tenants: dict[str, str] = field(default_factory=dict)  # key -> the tenant it is bound to

    @classmethod
    def of(cls, api_keys: Sequence[str] | Mapping[str, str | None] = (), chunk_writes: bool | str = True) -> Access:
        """``api_keys``: a list of keys, or a mapping of each key to the tenant it serves (None: unbound)."""
        if isinstance(api_keys, str):
            raise FusionRAGError("api_keys must be a list of keys (or a mapping of key to tenant), not one string")
        bound = dict(api_keys) if isinstance(api_keys, Mapping) else {}
        keys = tuple(api_keys)
        for index, key in enumerate(keys):
            _check_key(key, f"API key {index + 1} of {len(keys)}")
        tenants = {}
        for key, tenant in bound.items():
            if tenant is not None:
                if not check_tenant(tenant):
                    raise FusionRAGError("an API key is bound to the default tenant by leaving it unbound (None), "
                                         "not by an empty name")  # fmt: skip
                tenants[key] = check_tenant(tenant)
        if isinstance(chunk_writes, str):
            _check_key(chunk_writes, "the chunks key")
        elif not isinstance(chunk_writes, bool):
            raise FusionRAGError(f"chunk_writes must be True, False or a key, got {type(chunk_writes).__name__}")
        return cls(keys, chunk_writes, tenants)

    def bound_tenant(self, authorization: bytes | None) -> str | None:
        """The tenant the request's key is bound to, or None (an unbound key, or none)."""
        token = _bearer(authorization)
        if token is None or not self.tenants:
            return None
        digest = hashlib.sha256(token).digest()
        found = None
        for key, tenant in self.tenants.items():  # every bound key, each time
            if hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest()):
                found = tenant
        return found

    @property
    def open(self) -> bool:
        """Whether anyone who reaches the server may call it (no API key set)."""
        return not self.api_keys

    def refusal(self, method: str, path: str, authorization: bytes | None) -> JSONResponse | None:
        """The response that refuses this request, or None when it may go on."""
        if path in OPEN_PATHS:
            return None
        token = _bearer(authorization)
        general = _matches(token, self.api_keys)
        chunks_key = isinstance(self.chunk_writes, str) and _matches(token, (self.chunk_writes,))
        if method == "POST" and path.rstrip("/") == CHUNKS_PATH:
            return self._chunk_write_refusal(token, general, chunks_key)
        if self.open or general or chunks_key:
            return None
        return _unauthorized(token)

    def _chunk_write_refusal(self, token: bytes | None, general: bool, chunks_key: bool) -> JSONResponse | None:
        if self.chunk_writes is True:
            return None if self.open or general else _unauthorized(token)
        if self.chunk_writes is False:
            if not (self.open or general):
                return _unauthorized(token)
            return _forbidden("chunk writes are disabled on this server: POST /v1/chunks registers nothing here; "
                              "register chunks in the store before the server starts (fusionrag ingest --store)",
                              "chunk_writes_disabled")  # fmt: skip
        if chunks_key:
            return None
        if not general:  # no key, or a wrong one (with no API keys set, only the chunks key is one)
            return _unauthorized(token)
        return _forbidden("only the chunks key may register chunks on this server (POST /v1/chunks); "
                          "this key may call its other routes", "chunks_key_required")  # fmt: skip


class KeyCheck:
    """ASGI middleware: ``Access.refusal`` for every HTTP request before the app sees it; a request whose
    key is bound to a tenant carries it to the routes (``request.state.bound_tenant``)."""

    def __init__(self, app, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            refusal = self.access.refusal(scope["method"], scope["path"], headers.get(b"authorization"))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            scope.setdefault("state", {})["bound_tenant"] = self.access.bound_tenant(headers.get(b"authorization"))
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def _check_key(key, what: str) -> None:
    if not isinstance(key, str) or not key or not all("!" <= char <= "~" for char in key):
        raise FusionRAGError(f"{what} must be a non-empty string of printable ASCII characters without spaces "
                             "(what an Authorization header can carry)")  # fmt: skip


def _bearer(authorization: bytes | None) -> bytes | None:
    scheme, _, token = (authorization or b"").strip().partition(b" ")
    return (token.strip() or None) if scheme.lower() == b"bearer" else None


def _matches(token: bytes | None, keys: Sequence[str]) -> bool:
    if token is None or not keys:
        return False
    digest = hashlib.sha256(token).digest()
    found = [hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest()) for key in keys]  # all of them
    return any(found)


def _unauthorized(token: bytes | None) -> JSONResponse:
    if token is None:
        message = ("no API key was given: this server needs one, sent as 'Authorization: Bearer YOUR_KEY' "
                   "(the OpenAI client sends its api_key so)")  # fmt: skip
    else:
        message = "the API key given is not one this server accepts"
    body = error_body(message, "invalid_request_error", "invalid_api_key")
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def _forbidden(message: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, "permission_error", code), status_code=403)
