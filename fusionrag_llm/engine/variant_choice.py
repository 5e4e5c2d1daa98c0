"""Per-request choice between a chunk's fused and plain entries from this prompt's own KV, or their blend.

``"check"`` and ``"probe"`` start from a cache where every chunk is placed from its fused entry and,
for each chunk that has one, its plain entry is at hand (``Alternative``); they run part of the
model over the prompt, compare, and leave the cache as it was except for the chunks that switch to
plain. ``"blend"`` places such a chunk from the mix of its two entries instead. A chunk whose fused
entry was computed in this prompt's own context (``fusion/fused_order.context_in_place``) keeps its
fused entry under every policy.

* ``"check"``: the layers below ``VARIANT_CHECK_LAYER`` run once over every non-exact token; a chunk
  keeps the variant whose KV at that layer is closer to the exact KV there.
* ``"probe"``: every ``VARIANT_PROBE_STRIDE``-th token of each chunk runs through *every* layer over
  the fused context, so its KV at the upper half of the layers is a sample of what this prompt makes
  of the chunk. Fused entries pull upper layers towards the neighbours they were computed after,
  which a low-layer check cannot see. The probe reads the chunk's own fused KV, so its KV leans to
  the fused entry; a chunk therefore switches to plain when the probe is closer to the plain entry
  than ``VARIANT_PROBE_MARGIN`` times its distance to the fused one.
* ``"blend"``: no choice and no forward: every such chunk is placed from ``blend_entry``, its K/V
  ``VARIANT_BLEND`` times its fused entry's plus the rest times its plain entry's, mixed before
  placement (rotary embedding is linear, so the placed keys are the mix of the two placed ones).
  A selector that asks for it (``SelectorSpec.reads_variant_spread``) also gets each blended token's
  ``entry_spread`` in ``RequestLayout.variant_spread``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionrag_llm.engine.methods import VARIANT_BLEND, VARIANT_CHECK_LAYER, VARIANT_PROBE_MARGIN, VARIANT_PROBE_STRIDE
from fusionrag_llm.engine.plan import ResolveCounts
from fusionrag_llm.fusion.placement import place_entry
from fusionrag_llm.fusion.scorers.kv_deviation import squared_distance
from fusionrag_llm.fusion.selectors import RequestLayout
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.storage import KVEntry, kv_tensors


@dataclass
class Alternative:
    """A chunk placed from its fused entry at ``slots`` (first position ``start``), and its plain entry."""

    start: int
    slots: torch.Tensor
    fused: KVEntry
    plain: KVEntry


def check_variants(model, alternatives: list[Alternative], layout: RequestLayout, cache: KVCache,
                   counts: ResolveCounts) -> None:  # fmt: skip
    """variant_policy="check" (see the module docstring)."""
    layer = min(VARIANT_CHECK_LAYER, model.cfg.num_layers - 1)
    computed = torch.cat([layout.reused_slots, layout.fresh_slots]).sort().values
    saved = _save(cache, computed, layer)
    exact_k, exact_v = model.project_layer_kv(layout.step(computed), cache, layer=layer)
    rows = [torch.searchsorted(computed, alt.slots) for alt in alternatives]
    here = slice(layer, layer + 1)
    fused = [_deviation(cache, here, alt.slots, exact_k[None, :, r], exact_v[None, :, r]) for alt, r in zip(alternatives, rows)]
    _restore(cache, computed, saved, layer)
    for alt, index, fused_deviation in zip(alternatives, rows, fused):
        place_entry(model, cache, alt.plain, alt.start, alt.slots)
        plain_deviation = _deviation(cache, here, alt.slots, exact_k[None, :, index], exact_v[None, :, index])
        _keep(model, cache, alt, counts, plain=plain_deviation < fused_deviation)


def probe_variants(model, alternatives: list[Alternative], layout: RequestLayout, cache: KVCache,
                   counts: ResolveCounts) -> None:  # fmt: skip
    """variant_policy="probe" (see the module docstring). Costs one sparse prefill of about
    1/VARIANT_PROBE_STRIDE of the chunk tokens plus the fresh text."""
    num_layers = model.cfg.num_layers
    upper = slice(num_layers // 2, num_layers)
    spans = [torch.arange(s, e, device=cache.keys.device)[::VARIANT_PROBE_STRIDE] for s, e in layout.chunk_spans]
    probe = torch.cat([*spans, layout.fresh_slots]).sort().values
    saved = _save(cache, probe, num_layers)
    model(layout.step(probe, logit_rows=probe[:0]), cache)
    samples = [alt.slots[::VARIANT_PROBE_STRIDE] for alt in alternatives]
    probed = [(cache.keys[upper, :, s].clone(), cache.values[upper, :, s].clone()) for s in samples]
    _restore(cache, probe, saved, num_layers)
    for alt, rows, (keys, values) in zip(alternatives, samples, probed):
        to_fused = _deviation(cache, upper, rows, keys, values)
        place_entry(model, cache, alt.plain, alt.start, alt.slots)
        to_plain = _deviation(cache, upper, rows, keys, values)
        _keep(model, cache, alt, counts, plain=to_plain < VARIANT_PROBE_MARGIN * to_fused)


def blend_entry(fused: KVEntry, plain: KVEntry, device: torch.device, dtype: torch.dtype,
                spread: bool = False) -> tuple[KVEntry, torch.Tensor | None]:  # fmt: skip
    """variant_policy="blend" (see the module docstring): an entry of the chunk, unpacked on ``device``
    in ``dtype``, with ``fused``'s meta (the chunk stays counted as a fused hit); with ``spread``, also
    ``entry_spread`` of the two (else None)."""
    fused_keys, fused_values = kv_tensors(fused, device, dtype)
    plain_keys, plain_values = kv_tensors(plain, device, dtype)
    blended = KVEntry(fused.token_ids, torch.lerp(plain_keys, fused_keys, VARIANT_BLEND),
                      torch.lerp(plain_values, fused_values, VARIANT_BLEND), fused.meta)  # fmt: skip
    if not spread:
        return blended, None
    return blended, entry_spread(fused_keys, fused_values, plain_keys, plain_values)


def entry_spread(fused_keys: torch.Tensor, fused_values: torch.Tensor, plain_keys: torch.Tensor,
                 plain_values: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """[T] how far a chunk's fused and plain entries lie apart at each token: the L2 distance of their
    K and V over the upper half of the layers and every head (keys before rotary embedding, which
    keeps distances, so the value holds wherever the chunk is placed). The more a token's KV depends
    on what precedes the chunk, the less its blended KV can be trusted (selector
    ``query_guided_spread``)."""
    upper = fused_keys.shape[0] // 2  # [layers, heads, T, d] -> the upper layers as more heads
    keys = squared_distance(fused_keys[upper:].flatten(0, 1), plain_keys[upper:].flatten(0, 1))
    values = squared_distance(fused_values[upper:].flatten(0, 1), plain_values[upper:].flatten(0, 1))
    return (keys + values).sqrt()


def _keep(model, cache: KVCache, alt: Alternative, counts: ResolveCounts, *, plain: bool) -> None:
    """Leave ``alt``'s plain entry in its slots (counted) or put its fused one back."""
    if plain:
        counts.fused_declined += 1
        counts.variant_hits["fused"] -= 1
        counts.variant_hits["plain"] += 1
    else:
        place_entry(model, cache, alt.fused, alt.start, alt.slots)


def _save(cache: KVCache, rows: torch.Tensor, layers: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return cache.keys[:layers, :, rows].clone(), cache.values[:layers, :, rows].clone(), cache.valid[rows].clone()


def _restore(cache: KVCache, rows: torch.Tensor, saved: tuple[torch.Tensor, torch.Tensor, torch.Tensor], layers: int) -> None:
    cache.keys[:layers, :, rows], cache.values[:layers, :, rows], cache.valid[rows] = saved


def _deviation(cache: KVCache, layers: slice, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> float:
    """Squared K and V distance of the cache's ``layers`` in ``slots`` from ``keys``/``values``
    ([layers, heads, len(slots), head_dim]): summed over layers and heads, averaged over tokens."""
    layer_ids = range(*layers.indices(cache.keys.shape[0]))
    total = 0.0
    for i, layer in enumerate(layer_ids):
        total += float((squared_distance(cache.keys[layer, :, slots], keys[i])
                        + squared_distance(cache.values[layer, :, slots], values[i])).mean())  # fmt: skip
    return total
