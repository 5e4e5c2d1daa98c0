"""Each tenant's view of the store: its entry keys, and what reads, writes and computes under them.

A tenant other than the default one (``""``) has keys of its own (``EntryKeys.for_tenant``): its chunk
entries, fused entries and exact path blocks are filed apart from every other tenant's, and an entry
another tenant wrote is a miss even under a guessed key (the model it names is that tenant's). Its
exact prefixes kept in memory (a lossy store's) and its Cache-Craft variants are its own too.

Scopes are small but a server may see many tenants, so beyond ``MAX_TENANTS`` the least recently used
one is dropped and rebuilt on its next request (nothing is lost: all of it lives in the store).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from fusionrag_llm.fusion.entry_compute import EntryComputer
from fusionrag_llm.fusion.entry_keys import EntryKeys
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.fusion.request_variants import VARIANT_LOG, RequestVariants
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.prefix_cache import EXACT, PrefixCache, tenant_namespace
from fusionrag_llm.request import check_tenant

MAX_TENANTS = 256  # tenants whose scope is kept besides the default one
T = TypeVar("T")


class PerTenant(Generic[T]):
    """A value per tenant, made by ``make(tenant)`` on first use: the default tenant's always kept,
    other tenants' dropped (least recently used first) beyond ``limit`` and made again when asked for.

    >>> made = PerTenant(lambda tenant: f"<{tenant}>", limit=1)
    >>> made[None], made["a"], made["b"], len(made)
    ('<>', '<a>', '<b>', 1)
    """

    def __init__(self, make: Callable[[str], T], limit: int = MAX_TENANTS):
        self._make, self.limit = make, limit
        self.default = make("")
        self._others: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Other tenants' values kept now."""
        return len(self._others)

    def __getitem__(self, tenant: str | None) -> T:
        tenant = check_tenant(tenant)
        if not tenant:
            return self.default
        with self._lock:
            value = self._others.get(tenant)
            if value is None:
                value = self._others[tenant] = self._make(tenant)
                if len(self._others) > self.limit:
                    self._others.popitem(last=False)
            self._others.move_to_end(tenant)
            return value


@dataclass(frozen=True)
class TenantScope:
    tenant: str
    keys: EntryKeys
    entry_store: EntryStore
    computer: EntryComputer  # makes the entries a request of this tenant misses
    variants: RequestVariants | None  # Cache-Craft's request-made variants (None: not kept)


class TenantScopes(PerTenant[TenantScope]):
    """Each tenant's scope over one model's entries in one store."""

    def __init__(self, model: DecoderLM, entry_store: EntryStore, craft_variants: int = 0,
                 prefixes: PrefixCache | None = None):  # fmt: skip
        self.model, self.entry_store, self.craft_variants = model, entry_store, craft_variants
        # where a lossy store's exact prefixes are kept, each tenant under its own namespace
        self.prefixes = prefixes
        super().__init__(self._scope)

    def _scope(self, tenant: str) -> TenantScope:
        keys = self.entry_store.keys.for_tenant(tenant)
        entry_store = EntryStore(self.entry_store.store, keys) if tenant else self.entry_store
        variants = None
        if self.craft_variants:
            variants = RequestVariants(self.entry_store.store.record_log(VARIANT_LOG), keys.fingerprint, self.craft_variants)
        computer = EntryComputer(self.model, keys, entry_store, self.prefixes, tenant_namespace(tenant, EXACT))
        return TenantScope(tenant, keys, entry_store, computer, variants)
