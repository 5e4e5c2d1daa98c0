"""The plain ``transformers`` baseline of the TTFT benchmark: the engine's model as an HF model.

A real model is loaded with ``AutoModelForCausalLM`` from the folder the engine loaded it from;
the random-weight ``tiny`` model is rebuilt from its HF config and the engine's own weights. Its
TTFT is the wall time of ``generate(ids, max_new_tokens=1)`` on the engine's exact prompt ids.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch


def load_hf_twin(loaded) -> torch.nn.Module:
    """``AutoModelForCausalLM`` with the engine model's weights, device and dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    engine_model = loaded.model
    if loaded.source == "built-in":
        config = AutoConfig.for_model(**loaded.hf_config)
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(engine_model.state_dict())
    else:
        model = AutoModelForCausalLM.from_pretrained(loaded.source)
    return model.to(device=engine_model.device, dtype=engine_model.dtype).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def hf_first_token(model: torch.nn.Module, prompt_ids: Sequence[int]) -> tuple[float, int]:
    """(seconds, token): one greedy ``generate`` step on ``prompt_ids``, timed end to end."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], device=device)
    _sync(device)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                         temperature=None, top_p=None, top_k=None, pad_token_id=0)  # fmt: skip
    _sync(device)
    return time.perf_counter() - start, int(out[0, -1])
