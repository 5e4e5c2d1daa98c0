"""Run in a subprocess by the store tests: ingest and/or answer with the tiny model on a store folder."""

import json
import sys

from fusionrag_llm import FusionRAG, RAGRequest


def chunks(start: int, stop: int) -> list[str]:
    return [f"Chunk {i}: the harbour of town {i} holds {i * 7} boats and {i * 3} ferries each day." for i in range(start, stop)]


def main() -> None:
    folder, action, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rag = FusionRAG.from_pretrained("tiny", store=folder, options={"kv_codec": "model", "prefix_cache": False})
    texts = chunks(start, stop)
    vectors = [[1.0, float(i % 5), float(i % 3)] for i in range(start, stop)]
    result = {}
    if action in ("ingest", "both"):
        report = rag.add_chunks(texts, fuse=False, embeddings=vectors)
        result["plain_computed"] = report.plain_computed
    if action in ("answer", "both"):
        out = rag.generate(RAGRequest(chunks=texts[:3], question="How many boats?"), method="full_reuse", max_new_tokens=6)
        result.update(tokens=out.token_ids, path_hits=out.stats.path_hits)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
