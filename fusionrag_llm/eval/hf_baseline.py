"""The plain ``transformers`` baseline of the TTFT benchmark: the engine's model as an HF model.

A real model is loaded with ``AutoModelForCausalLM`` from the folder the engine loaded it from;
the random-weight ``tiny`` model is rebuilt from its HF config and the engine's own weights. Its
TTFT is the time ``generate`` takes to its first new token on the engine's exact prompt ids; its
end-to-end time is the whole ``generate`` of a fixed number of tokens.
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


class _FirstTokenClock:
    """A ``generate`` streamer that notes when the first new token arrives (its first ``put`` is the prompt)."""

    def __init__(self, device: torch.device):
        self.device, self.puts, self.first = device, 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            _sync(self.device)
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


@torch.inference_mode()
def hf_generate_timed(model: torch.nn.Module, prompt_ids: Sequence[int], new_tokens: int) -> dict:
    """One greedy ``generate`` of exactly ``new_tokens`` tokens: ``ttft_s`` (to the first new
    token), ``e2e_s`` (all of it) and the first token."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], device=device)
    clock = _FirstTokenClock(device)
    _sync(device)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0, streamer=clock)  # fmt: skip
    _sync(device)
    end = time.perf_counter()
    return {"ttft_s": clock.first - start, "e2e_s": end - start, "first_token": int(out[0, ids.shape[1]])}
