"""The integrations package imports neither framework until an adapter module is imported."""

import subprocess
import sys

CHECK = """
import sys
import fusionrag_llm.integrations
import fusionrag_llm.integrations._shared
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('llama_index', 'langchain_core', 'langchain'))
print(loaded)
"""


def test_package_import_is_lazy():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_adapter_modules_export_their_classes():
    from fusionrag_llm.integrations import langchain, llama_index

    assert set(llama_index.__all__) == {"FusionRAGEmbedding", "FusionRAGIngestion", "FusionRAGLLM", "FusionRAGRetriever"}
    assert {"ChatFusionRAG", "FusionRAGEmbeddings", "FusionRAGLLMLangChain", "FusionRAGRetriever",
            "add_documents"} <= set(langchain.__all__)  # fmt: skip
