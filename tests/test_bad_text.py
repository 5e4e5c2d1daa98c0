"""Malformed requests and text are refused with errors that name what was wrong, never raw ones."""

import pytest

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.request import PromptFormat


@pytest.fixture(scope="module")
def rag():
    return FusionRAG.from_pretrained("tiny", store=":memory:")


@pytest.mark.parametrize("chunks", [None, 7, b"bytes"])
def test_chunks_that_are_not_a_list_are_refused(chunks):
    with pytest.raises(FusionRAGError, match="RAGRequest.chunks must be a list of strings"):
        RAGRequest(chunks=chunks, question="Where?")


@pytest.mark.parametrize("label", ["[Doc_{m}] ", "{0}", "{n", 5])
def test_a_doc_label_with_another_field_is_refused(label):
    with pytest.raises(FusionRAGError, match=r"doc_label must be a string whose only field is \{n\}"):
        PromptFormat(doc_label=label)
    assert PromptFormat(doc_label="[Doc_{n}] ").doc_label == "[Doc_{n}] "


def test_a_lone_surrogate_anywhere_is_refused_with_its_position(rag):
    cases = [lambda: rag.generate(RAGRequest(chunks=["Paris is in France.", "a\ud800b"], question="Where?")),
             lambda: rag.generate(RAGRequest(chunks=["Paris is in France."], question="Wh\udfffere?")),
             lambda: rag.generate("Where is \ud83d Paris?"),
             lambda: rag.add_chunks(["fine", "x\udc00"], embeddings=[[1, 0], [0, 1]])]  # fmt: skip
    for case in cases:
        with pytest.raises(FusionRAGError, match=r"not valid Unicode: a lone surrogate U\+D[89A-F][0-9A-F]{2} at character"):
            case()
    assert rag.generate(RAGRequest(chunks=["Paris is in France."], question="Où est Paris ?"), max_new_tokens=2)
