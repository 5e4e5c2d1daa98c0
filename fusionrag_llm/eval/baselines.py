"""The baselines the benchmarks time on the engine's exact prompt ids: plain ``transformers`` and llama.cpp.

``transformers``: a real model is loaded with ``AutoModelForCausalLM`` from the folder the engine
loaded it from; the random-weight ``tiny`` model is rebuilt from its HF config and the engine's own
weights. Its TTFT is the time ``generate`` takes to its first new token; its end-to-end time is the
whole ``generate`` of a fixed number of tokens.

llama.cpp, the CPU yardstick: the same GGUF file, prompt token ids and threads. llama-cpp-python is
an optional extra (``pip install 'fusionrag_llm[llama-cpp]'``, built from source); every entry point
here says why llama.cpp is skipped instead of failing when it is absent or the model has no GGUF
file. Decoding is greedy through llama.cpp's own sampler at temperature 0.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import torch

LLAMA_CPP = "llama.cpp"


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


def default_gguf(model: str) -> Path | None:
    """The GGUF file ``model`` was converted from when it is the default model or a .gguf path."""
    from fusionrag_llm.models.default_model import DEFAULT_ALIASES, DEFAULT_MODEL, downloaded_gguf, installed_gguf
    from fusionrag_llm.paths import cache_dir

    if str(model).endswith(".gguf") and Path(model).is_file():
        return Path(model)
    if str(model).lower() in {DEFAULT_MODEL, *DEFAULT_ALIASES}:
        return installed_gguf() or downloaded_gguf(cache_dir())
    return None


def find_llama_cpp(model: str) -> tuple[Path | None, str]:
    """(the GGUF file to run, a line for the report); the file is None when llama.cpp is skipped."""
    try:
        import llama_cpp
    except ImportError:
        return None, "llama.cpp: skipped, llama-cpp-python is not installed (pip install 'fusionrag_llm[llama-cpp]')."
    gguf = default_gguf(model)
    if gguf is None:
        return None, f"llama.cpp: skipped, no GGUF file is known for {model!r}."
    return gguf, (f"llama.cpp: llama-cpp-python {llama_cpp.__version__} on {gguf.name}, same prompt token ids, "
                  f"{torch.get_num_threads()} threads, n_batch 512.")  # fmt: skip


class LlamaCpp:
    """One llama.cpp model and context of ``n_ctx`` tokens; ``close()`` frees its threads and memory."""

    def __init__(self, gguf: Path, n_ctx: int):
        from llama_cpp import Llama

        threads = torch.get_num_threads()
        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, verbose=False)  # fmt: skip

    def generate(self, ids: Sequence[int], new_tokens: int, stop_ids: frozenset[int] = frozenset()) -> dict:
        """Prefill ``ids`` from an empty cache, then up to ``new_tokens`` greedy tokens, ending before
        a token of ``stop_ids`` (none: exactly ``new_tokens``).

        ``ttft_s``: prefill and first token; ``e2e_s``: all of it; ``decode_s``: the steps after the first.
        """
        llm = self.llm
        llm.reset()  # the next eval starts at position 0 and drops what the cache held
        start = time.perf_counter()
        llm.eval(list(ids))
        tokens = [llm.sample(temp=0.0)]
        first = time.perf_counter()
        while len(tokens) < new_tokens and tokens[-1] not in stop_ids:
            llm.eval([tokens[-1]])
            tokens.append(llm.sample(temp=0.0))
        end = time.perf_counter()
        if tokens[-1] in stop_ids:
            tokens.pop()
        return {"ttft_s": first - start, "e2e_s": end - start, "decode_s": end - first, "token_ids": tokens}

    def close(self) -> None:
        self.llm.close()


def llama_cpp_decode(gguf: Path, ids: list[int], tokens: int) -> float:
    """llama.cpp's greedy decode tokens/s after prefilling ``ids`` (the first token is not counted)."""
    runner = LlamaCpp(gguf, n_ctx=len(ids) + tokens + 8)
    try:
        out = runner.generate(ids, tokens + 1)
    finally:
        runner.close()
    return tokens / out["decode_s"]
