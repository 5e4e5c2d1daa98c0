"""A step on the Triton path reads nothing back from the device but the sampled tokens: no per-layer,
per-sequence or per-request read (on a GPU each would wait for the device). Counted on the CPU
through the Triton interpreter: every call that copies tensor values to the host, or whose output
shape depends on tensor values (a boolean mask as an index, ``nonzero``), during ``step``."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.methods import make_plan
from fusionrag_llm.kernels._common import HAS_TRITON
from fusionrag_llm.models.kv_pool import KVPools

CHUNKS = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs."]
READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu, torch.nonzero, torch.Tensor.nonzero,
         torch.masked_select, torch.unique, torch.Tensor.unique, torch.argwhere, torch.equal}  # fmt: skip


class HostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS or (func is torch.Tensor.__getitem__ and _masked_index(args[1])):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _masked_index(index) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (index if isinstance(index, tuple) else (index,)))


def reads(step) -> int:
    with HostReads() as mode:
        step()
    return mode.count


def check_steps(rag: FusionRAG, method: str) -> None:
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.7, 0.7], [0, 1]], neighbors=1)
    engine = rag.engine
    plan = make_plan(method, 0.3 if method == "fusionrag" else None)
    for questions in (["When?", "Who?"], ["Why?", "Where?"]):  # the second pair reads entries checked before
        seqs = [engine.add_request(rag.segments(RAGRequest(chunks=CHUNKS, question=q)), plan, 3,
                                   sampling={"ignore_eos": True}) for q in questions]  # fmt: skip
        prefill = reads(engine.step)
        decodes = [reads(engine.step) for _ in range(2)]
        assert all(seq.finished for seq in seqs)
    assert prefill == 1  # both prefills in one step: the first tokens, read in one transfer
    assert decodes == [1, 1]  # each decode step: its tokens


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("method", ["fusionrag", "full_reuse"])
def test_a_step_reads_back_only_the_sampled_tokens(method):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False, "kernels": "triton"})
    rag.engine.runner.pools = KVPools.of(rag.engine.model, pool_bytes=4 << 20)  # as on CUDA
    check_steps(rag, method)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fusionrag", "full_reuse"])
def test_a_step_on_cuda_reads_back_only_the_sampled_tokens(method):
    check_steps(FusionRAG.from_pretrained("tiny", device="cuda", dtype="bfloat16", store=":memory:",
                                          options={"prefix_cache": False}), method)  # fmt: skip
