"""The Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2/2.5, Qwen3) as one readable forward pass.

Families differ only in flags of ``ModelConfig`` (projection biases, q/k norms, rope scaling).
Module names follow `transformers` so checkpoints load with ``load_state_dict`` unchanged.

The forward runs any set of tokens (ids + absolute positions) against a request's ``KVCache``:
their fresh K/V are written into the given slots first, then every query attends to the valid
slots at positions <= its own. A full prefill, a sparse recompute and a decode step are the same
call with different tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fusionrag_llm.kernels import dispatch
from fusionrag_llm.kernels.rotary import rotate
from fusionrag_llm.models.attention import attend, causal_tail_start, dense_sorted
from fusionrag_llm.models.config import ModelConfig
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.rotary import RotaryTable


@dataclass
class ForwardPass:
    """What one forward call computes; travels through the layers instead of long signatures."""

    token_ids: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] int64 absolute positions
    slots: torch.Tensor  # [n] where the tokens' K/V go in the cache
    logit_rows: torch.Tensor | None = None  # rows of the n tokens to produce logits for; None = all
    capture_query_layers: frozenset[int] = frozenset()  # layers whose rotated queries to return
    capture_raw_kv: bool = False  # return pre-rotary keys and values of the n tokens, all layers
    groups: torch.Tensor | None = None  # [n] int32 attention groups (see KVCache.attention_mask)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [len(logit_rows), vocab] float32
    queries: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [heads, n, head_dim]
    raw_keys: torch.Tensor | list | None = None  # [layers, kv_heads, n, head_dim], before rotary
    raw_values: torch.Tensor | list | None = None  # [layers, kv_heads, n, head_dim]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_size, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [heads, n, d], k and v [kv_heads, n, d]; q/k normed (Qwen3) but not yet rotated."""
        n, cfg = x.shape[0], self.cfg
        q = self.q_proj(x).view(n, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).view(n, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).view(n, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderBody(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(nn.Module):
    """Causal LM over a ``KVCache``; see the module docstring for the calling convention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTable(cfg.rope, cfg.head_dim)
        self.kernels = "torch"  # "triton": attention and rotary through the Triton kernels (set once at load)

    def to(self, *args, **kwargs):  # keep the rotary table on the module's device
        module = super().to(*args, **kwargs)
        self.rotary.inv_freq = self.rotary.inv_freq.to(self.model.norm.weight.device)
        return module

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def new_cache(self, capacity: int) -> KVCache:
        cfg = self.cfg
        return KVCache.empty(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, self.dtype, self.device)

    def rotary_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary.cos_sin(positions, self.dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, cos_sin=None) -> torch.Tensor:
        """``x`` [..., n, head_dim] (position-free keys or queries) rotated to ``positions`` [n].

        The Triton backend runs the rotary kernel; the torch backend uses ``cos_sin`` when the caller
        already has them (one table per forward, shared by every layer).
        """
        if self.kernels == "triton":
            flat = x.reshape(-1, *x.shape[-2:])
            return dispatch.apply_rotary(flat, positions, self.rotary.inv_freq, backend="triton").view(x.shape)
        cos, sin = cos_sin if cos_sin is not None else self.rotary_cos_sin(positions)
        return rotate(x, cos, sin)

    def _begin(self, step: ForwardPass, cache: KVCache):
        cache.positions[step.slots] = step.positions
        cache.valid[step.slots] = True
        if step.groups is not None:
            cache.groups[step.slots] = step.groups
        tail = None if step.groups is not None or self.kernels == "triton" else causal_tail_start(
            step.slots, step.positions, cache.positions, cache.valid, cache.length)  # fmt: skip
        dense = tail is None and step.groups is None and self.kernels == "torch" and dense_sorted(
            step.positions, cache.positions, cache.valid, cache.length)  # fmt: skip
        plain = tail is not None or dense
        mask = None if plain else cache.attention_mask(step.positions, step.groups)[None, None]
        return (mask, tail, step.positions if dense else None), self.rotary_cos_sin(step.positions), self.model.embed_tokens(step.token_ids)

    def _layer(self, index: int, x, step: ForwardPass, cache: KVCache, mask, cos, sin, out: ForwardOutput):
        layer = self.model.layers[index]
        q, k, v = layer.self_attn.project(layer.input_layernorm(x))
        if step.capture_raw_kv:
            out.raw_keys.append(k)
            out.raw_values.append(v)
        q, k = self.rotate(q, step.positions, (cos, sin)), self.rotate(k, step.positions, (cos, sin))
        if index in step.capture_query_layers:
            out.queries[index] = q
        cache.keys[index][:, step.slots] = k
        cache.values[index][:, step.slots] = v
        keys, values = cache.keys[index, :, : cache.length], cache.values[index, :, : cache.length]
        if self.kernels == "triton" and step.groups is None:
            n = cache.length
            attn = dispatch.q_sparse_attention(q, step.positions, keys, values, cache.positions[:n],
                                               cache.valid[:n], backend="triton")  # fmt: skip
        else:
            attn = attend(q, keys, values, *mask)  # mask: (position mask, causal tail start, sorted positions)
        x = x + layer.self_attn.o_proj(attn.transpose(0, 1).reshape(x.shape[0], -1))  # attn: [heads, n, d]
        return x + layer.mlp(layer.post_attention_layernorm(x))

    @torch.inference_mode()
    def project_layer_kv(self, step: ForwardPass, cache: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run layers [0, layer) for the step's tokens, then return their rotated keys and values at
        ``layer`` [kv_heads, n, d] without attending (CacheBlend's layer-wise KV deviation)."""
        mask, (cos, sin), x = self._begin(step, cache)
        scratch = ForwardOutput(logits=torch.empty(0), raw_keys=[], raw_values=[])
        for index in range(layer):
            x = self._layer(index, x, step, cache, mask, cos, sin, scratch)
        attn = self.model.layers[layer].self_attn
        _, k, v = attn.project(self.model.layers[layer].input_layernorm(x))
        return self.rotate(k, step.positions, (cos, sin)), v

    @torch.inference_mode()
    def forward(self, step: ForwardPass, cache: KVCache) -> ForwardOutput:
        mask, (cos, sin), x = self._begin(step, cache)  # x: [n, hidden]
        out = ForwardOutput(logits=torch.empty(0), raw_keys=[], raw_values=[])
        for index in range(len(self.model.layers)):
            x = self._layer(index, x, step, cache, mask, cos, sin, out)
        rows = x if step.logit_rows is None else x[step.logit_rows]
        out.logits = self.lm_head(self.model.norm(rows)).float()
        if step.capture_raw_kv:
            out.raw_keys, out.raw_values = torch.stack(out.raw_keys), torch.stack(out.raw_values)
        else:
            out.raw_keys = out.raw_values = None
        return out
