"""LlamaIndex RAG over the bundled demo corpus, answered with FusionRAG.

    python cookbook/llama_index_rag.py                  # SmolLM2-135M-Instruct, the embedded default
    python cookbook/llama_index_rag.py --model tiny     # random weights: checks the wiring in seconds
    python cookbook/llama_index_rag.py --question "Who built the Keldmouth lighthouse?" --method full_attention

The stock pieces do the work: an IngestionPipeline embeds the passages and FusionRAGIngestion
precomputes their fused KV entries (reusing the embeddings for the neighbour search); a
VectorStoreIndex query engine retrieves, formats its usual prompt and calls FusionRAGLLM, which
finds the retrieved passages in that prompt and reuses their entries.
"""

from __future__ import annotations

import argparse

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent
from llama_index.core.node_parser import SentenceSplitter

from fusionrag_llm import FusionRAG, method_names
from fusionrag_llm.data import demo_corpus
from fusionrag_llm.integrations.llama_index import FusionRAGEmbedding, FusionRAGIngestion, FusionRAGLLM


class LastStats(BaseEventHandler):
    """Keeps the FusionRAG stats of the latest LLM completion (LlamaIndex instrumentation)."""

    stats: dict = {}

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, (LLMCompletionEndEvent, LLMChatEndEvent)):
            self.stats = event.response.additional_kwargs.get("fusionrag_stats", {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help='"smollm2-135m" (default), "tiny", a folder or a .gguf')
    parser.add_argument("--question", default=None, help="default: the first question bundled with the corpus")
    parser.add_argument("--method", default="fusionrag", choices=method_names())
    parser.add_argument("--ratio", type=float, default=0.15, help="recompute ratio in [0, 1]")
    parser.add_argument("--store", default=None, help='KV store folder or ":memory:" (default: the user cache)')
    args = parser.parse_args(argv)

    corpus = demo_corpus()
    rag = FusionRAG.from_pretrained(args.model, store=args.store)
    embed_model = FusionRAGEmbedding()  # the packaged all-MiniLM-L6-v2, the engine's own
    steps = [SentenceSplitter(chunk_size=256), embed_model, FusionRAGIngestion(rag=rag)]  # embed, then fuse
    nodes = IngestionPipeline(transformations=steps).run(documents=[Document(text=passage) for passage in corpus["passages"]])
    index = VectorStoreIndex(nodes, embed_model=embed_model)

    recorder = LastStats()
    get_dispatcher().add_event_handler(recorder)
    llm = FusionRAGLLM(rag=rag, method=args.method, recompute_ratio=args.ratio, max_new_tokens=32)
    question = args.question or corpus["questions"][0]["question"]
    response = index.as_query_engine(llm=llm, similarity_top_k=3).query(question)

    stats = recorder.stats
    print(f"question: {question}")
    print(f"answer:   {str(response).strip()}")
    print(f"sources:  {[n.node.get_content()[:40] + '...' for n in response.source_nodes]}")
    print(f"method {stats['method']} (r={stats['recompute_ratio']}): TTFT {stats['ttft_s'] * 1000:.1f} ms, "
          f"{stats['prompt_tokens']} prompt tokens, {stats['reused_tokens']} reused, "
          f"{stats['recomputed_tokens']} recomputed, path hits {stats['path_hits']}")  # fmt: skip


if __name__ == "__main__":
    main()
