"""Three chunks of a two-hop question (designer of the lighthouse -> birthplace), the request that
asks it with the chunks out of order, and hand-made embeddings that make each chunk's neighbours the
other two; shared by the engine tests that run every method."""

from fusionrag_llm import FusionRAG, RAGRequest

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals.",
]
EMBEDDINGS = [[1, 0.2], [0.9, 0.4], [0.7, 0.7]]
REQUEST = RAGRequest(chunks=[CHUNKS[2], CHUNKS[0], CHUNKS[1]], question="Where was the lighthouse designer born?")


def lighthouse_rag(**options):
    """The tiny model over an in-memory store (no prefix cache) with the three chunks registered, each
    fused with the other two; ``options`` add engine options."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False, **options})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag
