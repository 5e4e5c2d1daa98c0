"""Kernel tests run the Triton code on CPU with the interpreter when no CUDA device is present.

TRITON_INTERPRET must be set before triton (and so any kernel module) is imported: triton decides
at decoration time whether ``@triton.jit`` builds an interpreted function.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
