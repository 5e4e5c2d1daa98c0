"""CacheClip: a smaller model's last-layer attention from the question to each chunk, chunk by chunk.

The auxiliary model is a separate model of the same tokenizer (``auxiliary=`` a name, path or
engine), or by default the first ``k`` layers of the main model (the embedded default has no
smaller sibling with its tokenizer). A separate model computes S0 and the chunk itself, then the
question. The first ``k`` layers need no such pass: their KV of every chunk is already in the
request cache (a plain entry was computed after the shared prefix S0, and its first ``k`` layers
are exactly what the auxiliary model would have stored), so only the question runs, once per chunk.

Per chunk, as in the paper's batch of ``S0 + chunk_i + question``: a small cache holds S0 and the
chunk (S0's keys turned to sit right before the chunk), the question tokens run through layers
``[0, k - 1)`` over it, and each chunk token is scored by the softmax attention the question's
layer ``k - 1`` queries give it (S0 and the question take part in the softmax but are not scored).
Scores are summed over question tokens and heads, so every chunk is normalised alike.

``pick`` is CacheClip's grouping: the top ``k`` by score, then windows of ``GROUP_TOKENS`` aligned
to the chunk start keep their selected tokens only when more than ``GROUP_THRESHOLD`` of them are
selected, so fewer than ``k`` tokens may be recomputed.
"""

from __future__ import annotations

import torch

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers.shaping import GROUP_TOKENS, chunk_of, group_ids
from fusionrag_llm.kernels.dispatch import critical_scores
from fusionrag_llm.models.forward import ForwardPass
from fusionrag_llm.models.kv_cache import KVCache

GROUP_THRESHOLD = 5  # a window is recomputed when more than this many of its tokens are selected
LAYER_SHARE = 4  # default auxiliary depth: num_layers // LAYER_SHARE layers of the main model (at least 1)


def default_layers(num_layers: int) -> int:
    return max(1, num_layers // LAYER_SHARE)


def check_layers(value: int | None, num_layers: int) -> int:
    """The auxiliary depth to use: ``value`` layers of the main model (``None``: the default)."""
    if value is None:
        return default_layers(num_layers)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= num_layers:
        raise FusionRAGError(f"auxiliary must be a number of layers of the main model in [1, {num_layers}], got {value!r}")
    return value


def scores(inp: ScoringInput) -> torch.Tensor:
    layout, cache = inp.layout, inp.cache
    separate = inp.auxiliary_model is not None
    layers = inp.auxiliary_model.cfg.num_layers if separate else check_layers(inp.auxiliary_layers, inp.model.cfg.num_layers)
    reused = layout.reused_slots
    out = torch.zeros(reused.numel(), dtype=torch.float32, device=reused.device)
    if reused.numel() == 0 or layout.suffix_slots.numel() == 0:
        return out
    prefix = layout.prefix_length
    owner = chunk_of(layout)
    for index, (start, end) in enumerate(layout.chunk_spans):
        members = owner == index
        if bool(members.any()):
            score = _separate_model_scores if separate else _chunk_scores
            chunk = score(inp, layers, prefix, start, end)
            out[members] = chunk[reused[members] - start]
    return out


def pick(layout: RequestLayout, scores: torch.Tensor, k: int) -> torch.Tensor:
    """The top ``k`` reused slots, then only those in windows with more than GROUP_THRESHOLD picked."""
    top = torch.topk(scores, k).indices
    chosen = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    chosen[top] = True
    windows = group_ids(layout, GROUP_TOKENS)
    count = torch.zeros(int(windows.max()) + 1, dtype=torch.long, device=scores.device)
    count.index_add_(0, windows, chosen.long())
    keep = chosen & (count[windows] > GROUP_THRESHOLD)
    return layout.reused_slots[keep].sort().values


def _separate_model_scores(inp: ScoringInput, layers: int, prefix: int, start: int, end: int) -> torch.Tensor:
    """``_chunk_scores`` by a separate auxiliary model: it runs S0 and the chunk (at the positions S0
    takes right before the chunk), then the question, and its last layer's attention scores."""
    aux, layout = inp.auxiliary_model, inp.layout
    device, ids = layout.token_ids.device, layout.token_ids
    question = layout.suffix_slots
    length, asked = prefix + end - start, question.numel()
    small = aux.new_cache(length + asked)
    context = torch.cat([ids[:prefix], ids[start:end]])
    context_positions = torch.arange(start - prefix, end, device=device)
    aux(ForwardPass(context, context_positions, small.reserve(length), logit_rows=context[:0]), small)
    positions = torch.arange(end, end + asked, device=device)
    step = ForwardPass(ids[question], positions, small.reserve(asked))
    queries, keys, _ = aux.project_layer(step, small, layer=layers - 1)
    every = torch.cat([small.keys[layers - 1, :, :length], keys], dim=1)
    where = torch.cat([context_positions, positions])
    valid = torch.ones(length + asked, dtype=torch.bool, device=device)
    attention = critical_scores(queries, positions, every, where, valid, backend=aux.kernels)
    return attention[prefix:length].float()


def _chunk_scores(inp: ScoringInput, layers: int, prefix: int, start: int, end: int) -> torch.Tensor:
    """Attention of the question to each token of chunk [start, end) in the auxiliary model: [end - start]."""
    model, cache, layout = inp.model, inp.cache, inp.layout
    question = layout.suffix_slots
    length, asked = prefix + end - start, question.numel()
    small = KVCache.empty(layers, cache.keys.shape[1], cache.keys.shape[3], length + asked, cache.keys.dtype,
                          cache.keys.device)  # fmt: skip
    shift = torch.full((prefix,), start - prefix, device=question.device)
    small.keys[:, :, :prefix] = model.rotate(cache.keys[:layers, :, :prefix], shift)  # S0 right before the chunk
    small.values[:, :, :prefix] = cache.values[:layers, :, :prefix]
    small.keys[:, :, prefix:length] = cache.keys[:layers, :, start:end]
    small.values[:, :, prefix:length] = cache.values[:layers, :, start:end]
    small.positions[:length] = torch.arange(start - prefix, end, device=question.device)
    small.valid[:length] = True
    small.length = length
    positions = torch.arange(end, end + asked, device=question.device)
    step = ForwardPass(layout.token_ids[question], positions, small.reserve(asked))
    queries, keys, _ = model.project_layer(step, small, layer=layers - 1)
    every = torch.cat([small.keys[layers - 1, :, :length], keys], dim=1)
    where = torch.cat([small.positions[:length], positions])
    valid = torch.ones(length + asked, dtype=torch.bool, device=question.device)
    attention = critical_scores(queries, positions, every, where, valid, backend=model.kernels)
    return attention[prefix:length].float()
