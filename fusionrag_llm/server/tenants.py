"""Which tenant a request to the server is served for: the one place that decides it.

Today the client names it in the body (``tenant``, or vLLM's ``cache_salt``; both given must agree) or,
for ``GET /v1/chunks``, in the query string; nothing named is the default tenant. A server that maps
API keys to tenants decides it here from the request's headers too, and every endpoint follows.
OpenAI's ``user`` field (an end-user id for abuse monitoring) is not a tenant.
"""

from __future__ import annotations

from typing import Any

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.request import check_tenant


def request_tenant(request: Any, tenant: str | None = None, cache_salt: str | None = None) -> str:
    """The tenant ``request`` (the HTTP request) is served for, given what its body or query named.

    >>> request_tenant(None, cache_salt="acme"), request_tenant(None)
    ('acme', '')
    """
    if tenant is not None and cache_salt is not None and tenant != cache_salt:
        raise FusionRAGError("tenant and cache_salt name the same thing (the tenant the request is served for); "
                             "give one, or both equal")  # fmt: skip
    return check_tenant(tenant if tenant is not None else cache_salt)
