"""Whether this machine runs the compiled CPU prefill attention (``kernels/cpu_attention.py``): it needs a C
compiler and AVX-512; elsewhere PyTorch's attention runs and the tests of the kernel skip."""

import pytest
import torch

from fusionrag_llm.kernels.cpu_attention import attend_prefix_cpu


def _runs() -> bool:
    q = torch.zeros(1, 1, 64)
    return attend_prefix_cpu(q, q, q, torch.ones(1, dtype=torch.int64)) is not None


needs_prefill_kernel = pytest.mark.skipif(not _runs(), reason="no compiled prefill attention here (no compiler or AVX-512)")
