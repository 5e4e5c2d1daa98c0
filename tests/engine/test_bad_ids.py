"""Continuation ids outside the vocabulary are a clear error before any compute, not a torch IndexError."""

import numpy as np
import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest

REQUEST = RAGRequest(chunks=["Keldmouth is the only town on the island of Varrow."], question="Which town?")
VOCAB = 259  # the tiny model's vocabulary


@pytest.fixture(scope="module")
def rag():
    return FusionRAG.from_pretrained("tiny", store=":memory:")


BAD = [
    ([1, -1], r"continuation_ids\[1\] is -1 \(int\); token ids must be ints in \[0, 259\)"),
    ([VOCAB], r"continuation_ids\[0\] is 259 \(int\); token ids must be ints in \[0, 259\)"),
    ([3, 10**12], r"continuation_ids\[1\] is 1000000000000"),
    ([2.0], r"continuation_ids\[0\] is 2.0 \(float\)"),
    ([True], r"continuation_ids\[0\] is True \(bool\)"),
    ([None], r"continuation_ids\[0\] is None \(NoneType\)"),
    (["7"], r"continuation_ids\[0\] is '7' \(str\)"),
    ([[1, 2]], r"continuation_ids\[0\] is \[1, 2\] \(list\)"),
    ("abc", r"continuation_ids must be a sequence of int token ids, got str"),
    (5, r"continuation_ids must be a sequence of int token ids, got int"),
    (torch.tensor([1.0, 2.0]), r"continuation_ids must be a sequence of int token ids, got Tensor"),
    (torch.tensor([[1, 2]]), r"continuation_ids must be a sequence of int token ids, got Tensor"),
]


@pytest.mark.parametrize("ids, message", BAD)
def test_logits_refuses_bad_continuation_ids(rag, ids, message):
    with pytest.raises(FusionRAGError, match=message) as caught:
        rag.logits(REQUEST, ids, method="full_attention")
    assert isinstance(caught.value, ValueError)


def test_logits_accepts_lists_tuples_tensors_and_arrays(rag):
    reference = rag.logits(REQUEST, [1, 2, VOCAB - 1], method="full_attention")
    for ids in ((1, 2, VOCAB - 1), torch.tensor([1, 2, VOCAB - 1]), np.array([1, 2, VOCAB - 1])):
        # the first call stored the prompt's exact KV; later calls reuse it, hence a tolerance
        torch.testing.assert_close(rag.logits(REQUEST, ids, method="full_attention"), reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("ids, message", [(b, m.replace("continuation_ids", "continuation")) for b, m in BAD])
def test_score_refuses_bad_ids_and_leaves_the_stream_alone(rag, ids, message):
    stream = rag.stream(REQUEST, method="fusionrag", max_new_tokens=3)
    with pytest.raises(FusionRAGError, match=message):
        stream.score(ids)
    text = "".join(stream)  # refused before the stream was touched: it still decodes
    assert text == rag.generate(REQUEST, method="fusionrag", max_new_tokens=3).text
    assert stream.score(torch.tensor([5, 6])).shape == (2, VOCAB)
