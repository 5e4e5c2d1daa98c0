"""Which tenant a request to the server is served for: the one place that decides it.

An API key bound to a tenant (``access.py``) decides it: the request is served for that tenant, and
one that names another is refused. Otherwise the client names it in the body (``tenant``, or vLLM's
``cache_salt``; both given must agree) or, for ``GET /v1/chunks``, in the query string; nothing named
is the default tenant. OpenAI's ``user`` field (an end-user id for abuse monitoring) is not a tenant.
"""

from __future__ import annotations

from typing import Any

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.request import check_tenant


class TenantRefused(FusionRAGError):
    """A request names another tenant than the one its API key is bound to (HTTP 403)."""


def request_tenant(request: Any, tenant: str | None = None, cache_salt: str | None = None) -> str:
    """The tenant ``request`` (the HTTP request) is served for, given what its body or query named.

    >>> request_tenant(None, cache_salt="acme"), request_tenant(None)
    ('acme', '')
    """
    if tenant is not None and cache_salt is not None and tenant != cache_salt:
        raise FusionRAGError("tenant and cache_salt name the same thing (the tenant the request is served for); "
                             "give one, or both equal")  # fmt: skip
    named = check_tenant(tenant if tenant is not None else cache_salt)
    state = getattr(request, "scope", {}).get("state") or {}
    bound = state.get("bound_tenant")
    if bound is None:
        return named
    if (tenant is not None or cache_salt is not None) and named != bound:
        raise TenantRefused("this API key serves one tenant only; the request names another (leave tenant and "
                            "cache_salt out, or name the key's own)")  # fmt: skip
    return bound
