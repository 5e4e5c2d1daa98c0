"""Decode steps on the CPU in one compiled call per step.

A decode step of a small model on a CPU is mostly overhead when it runs layer by layer from Python:
after a 900-token prompt, SmolLM2-135M's step took about 18 ms here, of which 6 ms were the 4-bit
matrix products and 4 ms attention; the rest was some 4,800 small torch operations (norms, rotary,
views, cache writes) and the interpreter between them. ``DecodeProgram`` hands the decoder layers
of such a step to ``fr_decode_layers`` (``kernels/cpu_kernels.c``): norms, the projections (the
block-quantized kernel of ``cpu_quant.run_linear``, or float32 rows), Qwen3's q/k norms, rotary, the K/V
write and attention over each sequence's cache, and the MLP, for every sequence of the step at once.
The embedding, the final norm and the output head stay in torch.

It computes what the layer-by-layer forward computes, in float32 with the same weights, summed in
another order (logits agree to about 1e-5 relative). It takes a step only where that forward would
take its plainest path; anything else runs layer by layer as before:

* every sequence brings one decode token that sees every used slot of its cache (the cache's fast
  path ``causal_tail_start``), with no observer, capture or attention groups;
* the model is float32 on the CPU with the torch attention backend; each decoder linear is read as
  its quantized copy where it has one (``DecoderLM.quantize_linears``: "auto" on a GGUF model), else
  as its float32 weight;
* the step has no APE scaling; the cache is float32 with no KV still arriving.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from fusionrag_llm.kernels import cpu_quant

if TYPE_CHECKING:
    from fusionrag_llm.models.forward import BatchContext, ForwardPass
    from fusionrag_llm.models.kv_cache import KVCache
    from fusionrag_llm.models.linear import Linear


_MOST_GROUP, _MOST_HEAD_DIM = 16, 512  # FR_GROUP and the rotary buffer of cpu_kernels.c


class _Weight(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_int64), ("tiled", ctypes.c_int64), ("q", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("m", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p), ("proj", _Weight * 7)]  # fmt: skip


class _Model(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_int64), ("hidden", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("intermediate", ctypes.c_int64),
                ("eps", ctypes.c_double), ("layer", ctypes.POINTER(_Layer))]  # fmt: skip


def _quantized(quant: cpu_quant.QuantWeight) -> _Weight:
    m = quant.m.data_ptr() if quant.m is not None else None
    return _Weight(8 if quant.fmt == "q8" else 4, int(quant.tiled), quant.q.data_ptr(), quant.d.data_ptr(), m,
                   *quant.shape)  # fmt: skip


def _linears(block) -> tuple[Linear, ...]:
    """A decoder layer's projections in the C layer's order: q, k, v, o, gate, up, down."""
    attn, mlp = block.self_attn, block.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _weight(linear: Linear) -> _Weight:
    """What a decode step reads of ``linear``: its quantized copy, else its float32 weight."""
    if linear.quantized:
        return _quantized(linear._quant[0])
    return _Weight(32, 0, linear.weight.data_ptr(), None, None, *linear.weight.shape)


def _readable(linear: Linear) -> bool:
    weight = linear.weight
    return bool(linear.quantized) or (weight.dtype == torch.float32 and weight.is_contiguous() and weight.device.type == "cpu")


class DecodeProgram:
    """The compiled decode step of one ``DecoderLM`` (see the module docstring); ``build`` returns None
    where the model cannot take it. It points at the model's tensors: ``current`` says whether they
    are still the ones it was built on."""

    def __init__(self, model, library: ctypes.CDLL):
        cfg = model.cfg
        self._library = library
        # (layer, its quantized copy or None, its weight, the weight's data pointer and version when the
        # copy was made, or now for a float weight)
        self._linears: list[tuple[Linear, object, torch.Tensor, int, int]] = []
        self._norms: list[tuple[torch.Tensor, int]] = []
        layers = []
        for block in model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            linears = _linears(block)
            for linear in linears:
                state = linear._quant[1:] if linear.quantized else (linear.weight.data_ptr(), linear.weight._version)
                self._linears.append((linear, linear._quant, linear.weight, *state))
            proj = [_weight(linear) for linear in linears]
            empty = _Weight(0, 0, None, None, None, 0, 0)
            qkv, gate_up = attn.qkv._fused, mlp.gate_up._fused  # one weight of q|k|v (gate|up) rows, or None
            if qkv is not None:
                proj[0:3] = [_quantized(qkv[0]), empty, empty]
            if gate_up is not None:
                proj[4:6] = [_quantized(gate_up[0]), empty]
            norms = [block.input_layernorm.weight, block.post_attention_layernorm.weight]
            norms += [attn.q_norm.weight, attn.k_norm.weight] if cfg.qk_norm else [None, None]
            norms.append(_qkv_bias(attn))
            self._norms += [(w, w.data_ptr()) for w in norms if w is not None]
            pointers = [w.data_ptr() if w is not None else None for w in norms]
            layers.append(_Layer(pointers[0], pointers[1], pointers[4], pointers[2], pointers[3], (_Weight * 7)(*proj)))
        self._layers = (_Layer * len(layers))(*layers)
        self._model = _Model(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size, cfg.rms_norm_eps, self._layers)  # fmt: skip

    @classmethod
    def build(cls, model) -> "DecodeProgram | None":
        cfg = model.cfg
        if model.device.type != "cpu" or model.dtype != torch.float32 or not len(model.model.layers):
            return None
        if cfg.num_heads // cfg.num_kv_heads > _MOST_GROUP or cfg.head_dim > _MOST_HEAD_DIM or cfg.head_dim % 2:
            return None  # beyond the compiled call's fixed buffers
        for block in model.model.layers:
            if not all(_readable(linear) for linear in _linears(block)):
                return None
            norms = [block.input_layernorm, block.post_attention_layernorm]
            norms += [block.self_attn.q_norm, block.self_attn.k_norm] if cfg.qk_norm else []
            if any(not norm.weight.is_contiguous() for norm in norms):
                return None
        try:
            library = cpu_quant.load_library()
        except RuntimeError:
            return None
        return cls(model, library)

    def current(self) -> bool:
        """Every weight it points at is still the model's, unchanged since it was quantized or, for a float
        weight, since the program was built (``Linear.quantized``'s test, without the module attribute
        lookups: it runs every step)."""
        return all(linear._quant is quant and linear._parameters["weight"] is weight and weight._version == version
                   and weight.data_ptr() == ptr for linear, quant, weight, ptr, version in self._linears) and all(
            tensor.data_ptr() == ptr for tensor, ptr in self._norms)  # fmt: skip

    def taken(self, batch: BatchContext) -> list[int]:
        """The sequences of the step the compiled call computes exactly like the layer-by-layer forward."""
        if batch.attention.name != "torch" or batch.cos_sin is None:
            return []
        parts = zip(batch.steps, batch.caches, batch.metas)
        return [i for i, (step, cache, meta) in enumerate(parts) if _takes(step, cache, meta)]

    def run(self, x: torch.Tensor, batch: BatchContext) -> torch.Tensor:
        """The last decoder layer's output [rows, hidden] for the embeddings ``x`` [rows, hidden]."""
        rows = len(batch.steps)
        x = x.float().contiguous().clone()
        cos, sin = (t.float().contiguous() for t in batch.cos_sin)  # the forward's own rotary tables
        pointers = ctypes.c_void_p * rows
        keys = pointers(*(cache.keys.data_ptr() for cache in batch.caches))
        values = pointers(*(cache.values.data_ptr() for cache in batch.caches))
        capacity = torch.tensor([cache.capacity for cache in batch.caches], dtype=torch.int64)
        length = torch.tensor([cache.length for cache in batch.caches], dtype=torch.int64)
        status = self._library.fr_decode_layers(ctypes.byref(self._model), rows, x.data_ptr(), cos.data_ptr(),
                                                sin.data_ptr(), keys, values, capacity.data_ptr(),
                                                length.data_ptr())  # fmt: skip
        if status == 1:
            raise MemoryError("decode step: no memory for the compiled layers' work buffers")
        if status:
            raise RuntimeError("decode step: the compiled layers refused this model (tiled weights without AVX-512?)")
        return x


def _takes(step: ForwardPass, cache: KVCache, meta) -> bool:
    """One sequence's part of a step is one the compiled call takes (``meta``: what the torch attention
    backend prepared for it)."""
    if not (step.decode and len(step.token_ids) == 1 and step.groups is None and not step.hooks
            and not step.capture_raw_kv and not step.capture_query_layers):  # fmt: skip
        return False
    if getattr(meta, "tail_start", None) is None or step.scaling is not None or cache.feed is not None:
        return False
    if cache.keys.dtype != torch.float32 or not cache.keys.is_contiguous():
        return False
    return cache.values.is_contiguous() and int(step.slots[0]) == cache.length - 1


def _qkv_bias(attn) -> torch.Tensor | None:
    """The q|k|v projections' biases as one vector (zeros for a projection without one), or None."""
    fused = attn.qkv._fused
    if fused is not None:
        return fused[1].contiguous() if fused[1] is not None else None
    linears = (attn.q_proj, attn.k_proj, attn.v_proj)
    if all(linear.bias is None for linear in linears):
        return None
    return torch.cat([linear.bias.detach() if linear.bias is not None else torch.zeros(linear.out_features)
                      for linear in linears]).float().contiguous()  # fmt: skip
