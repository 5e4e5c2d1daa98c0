"""The adapters' ``tenant``: what their ingestion hooks register serves only the LLMs of the same tenant,
in a real LlamaIndex query engine and a LangChain chain; a bad tenant is refused at construction."""

import pytest
from fusionrag_llm.integrations.langchain import (
    ChatFusionRAG,
    FusionRAGDocumentTransformer,
    FusionRAGLLMLangChain,
)
from fusionrag_llm.integrations.llama_index import FusionRAGIngestion, FusionRAGLLM
from integration_helpers import BagOfWordsEmbedding
from langchain_core.documents import Document as LangChainDocument
from langchain_core.prompts import ChatPromptTemplate
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.schema import MetadataMode


def test_llama_index_nodes_ingested_for_a_tenant_serve_only_its_llm(fresh_rag, corpus):
    documents = [Document(text=text) for text in corpus["passages"][:4]]
    steps = [BagOfWordsEmbedding(), FusionRAGIngestion(rag=fresh_rag, neighbors=2, tenant="acme")]
    nodes = IngestionPipeline(transformations=steps).run(documents=documents)
    assert len(fresh_rag.chunks_of("acme")) == len(nodes) and len(fresh_rag.chunks) == 0
    context = "\n\n".join(node.get_content(metadata_mode=MetadataMode.LLM) for node in nodes[:2])
    found = {}
    for tenant in ("acme", "other", None):
        llm = FusionRAGLLM(rag=fresh_rag, max_new_tokens=2, tenant=tenant)
        stats = llm.complete(f"Context:\n{context}\n\nQuestion: what?").additional_kwargs["fusionrag_stats"]
        found[tenant] = stats["path_hits"]["chunk"] + stats["path_hits"]["exact"]
    assert found == {"acme": 2, "other": 0, None: 0}
    index = VectorStoreIndex(nodes, embed_model=BagOfWordsEmbedding())  # a real query engine answers for it
    llm = FusionRAGLLM(rag=fresh_rag, max_new_tokens=2, tenant="acme")
    assert index.as_query_engine(llm=llm, similarity_top_k=2).query(corpus["questions"][0]["question"]).source_nodes


def test_langchain_documents_transformed_for_a_tenant_serve_only_its_models(fresh_rag, corpus):
    texts = corpus["passages"][:3]
    FusionRAGDocumentTransformer(fresh_rag, tenant="acme", neighbors=1).transform_documents(
        [LangChainDocument(page_content=text) for text in texts])  # fmt: skip
    assert len(fresh_rag.chunks_of("acme")) == 3 and len(fresh_rag.chunks) == 0
    prompt = ChatPromptTemplate.from_messages([("user", "Documents:\n{context}\n\nQuestion: {question}")])
    values = {"context": "\n\n".join(texts[:2]), "question": "What?"}
    reused = {}
    for tenant in ("acme", "other", None):
        chain = prompt | ChatFusionRAG(rag=fresh_rag, max_tokens=2, tenant=tenant)
        reused[tenant] = chain.invoke(values).response_metadata["fusionrag_stats"]["path_hits"]["chunk"]
    assert reused == {"acme": 2, "other": 0, None: 0}
    llm = FusionRAGLLMLangChain(rag=fresh_rag, max_tokens=2, tenant="acme")
    stats = llm.generate([f"Read: {texts[0]}\n\nWhat?"]).generations[0][0].generation_info["fusionrag_stats"]
    assert stats["path_hits"]["chunk"] == 1
    # LangChain's answer cache keys on these: tenants never share cached answers
    assert llm._identifying_params["tenant"] == "acme"
    assert "tenant" not in FusionRAGLLMLangChain(rag=fresh_rag)._identifying_params


@pytest.mark.parametrize("tenant", ["x" * 129, "a\nb", 3])
def test_a_bad_adapter_tenant_is_refused_when_built(rag, tenant):
    for make in (lambda: FusionRAGLLM(rag=rag, tenant=tenant), lambda: FusionRAGIngestion(rag=rag, tenant=tenant),
                 lambda: ChatFusionRAG(rag=rag, tenant=tenant), lambda: FusionRAGLLMLangChain(rag=rag, tenant=tenant),
                 lambda: FusionRAGDocumentTransformer(rag, tenant=tenant)):  # fmt: skip
        with pytest.raises(ValueError, match="tenant|string"):
            make()
