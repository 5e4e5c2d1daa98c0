"""Fused entries averaged over several contexts (analysis only; the engine does not do this).

Runs ``fusionrag`` with ``EntryComputer.compute_fused`` patched: a chunk's fused entry is the mean
K/V of CONTEXTS computations of it, the paper's (after S0 and every neighbour that fits, in the
configured layout) and CONTEXTS - 1 more after a random subset of those neighbours (1 to all of them)
in a random order, drawn from a generator seeded by the chunk's tokens. Keys are position-free, so
the mean needs no re-rotation. The meta (neighbour ids) stays the paper's, so variant policies read
the same ids; ``blend`` then averages this mean with the plain entry.

The idea under test: at query time the chunks ahead of a chunk are some of its neighbours in some
order, so the expected KV over such contexts is closer to what a request needs than the KV of one
of them. Use a store of its own (its fused entries differ from the engine's under the same keys):

    CONTEXTS=4 python context_mean.py bench quality ... --store /path/outside/the/repo/kv-context-mean
"""
import hashlib
import os
import random

from fusionrag_llm.cli.main import main
from fusionrag_llm.fusion.entry_compute import EntryComputer
from fusionrag_llm.storage import KVEntry

CONTEXTS = int(os.environ.get("CONTEXTS", "4"))
paper = EntryComputer.compute_fused


def compute_fused(self, token_ids, neighbours, neighbour_ids, notes=False, rows=None):
    base = paper(self, token_ids, neighbours, neighbour_ids, notes, rows)
    used = len(base.meta.get("neighbours") or [])
    if used == 0 or CONTEXTS <= 1:
        return base
    seed = int.from_bytes(hashlib.sha256(repr(tuple(token_ids)).encode()).digest()[:8], "little")
    rng = random.Random(seed)
    keys, values = base.keys.double(), base.values.double()
    for _ in range(CONTEXTS - 1):
        pick = rng.sample(range(used), rng.randint(1, used))  # random subset, random order
        other = paper(self, token_ids, [neighbours[i] for i in pick], [neighbour_ids[i] for i in pick], False,
                      None if rows is None else [rows[i] for i in pick])
        keys += other.keys.double()
        values += other.values.double()
    return KVEntry(base.token_ids, (keys / CONTEXTS).to(base.keys.dtype), (values / CONTEXTS).to(base.values.dtype),
                   base.meta)


EntryComputer.compute_fused = compute_fused
main()
