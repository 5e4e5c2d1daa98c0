"""Run by test_concurrent_ingest: ingest some of the 24 test chunks into a store folder, fused, 4 neighbours.

Arguments: store folder, sync folder (or "-" to start at once), worker name, chunk numbers ("0,1,2").
With a sync folder the worker opens the store first (reading the catalog as it is then), writes
``ready-<name>`` and waits for ``go``: every worker has opened the store before any ingests.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

from fusionrag_llm import FusionRAG

COUNT, DIM, NEIGHBOURS = 24, 16, 4
# Random directions in 16 dimensions: no two similarities tie, so the neighbour order is unique.
VECTORS = np.random.default_rng(7).standard_normal((COUNT, DIM)).astype(np.float32)


def text_of(number: int) -> str:
    return f"Chunk {number}: the harbour of town {number} holds {number * 7} boats."


def main() -> None:
    folder, sync, name, numbers = sys.argv[1], sys.argv[2], sys.argv[3], [int(n) for n in sys.argv[4].split(",")]
    rag = FusionRAG.from_pretrained("tiny", store=folder, options={"prefix_cache": False})
    if sync != "-":
        Path(sync, f"ready-{name}").touch()
        while not Path(sync, "go").exists():
            time.sleep(0.01)
    report = rag.add_chunks([text_of(n) for n in numbers], neighbors=NEIGHBOURS, embeddings=VECTORS[numbers])
    print(json.dumps({"plain": report.plain_computed, "fused": report.fused_computed}))


if __name__ == "__main__":
    main()
