"""The Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2/2.5, Qwen3) as one readable forward pass.

Families differ only in flags of ``ModelConfig`` (projection biases, q/k norms, rope scaling).
Module names follow `transformers` so checkpoints load with ``load_state_dict`` unchanged.

The forward runs any set of tokens (ids + absolute positions) against a request's ``KVCache``:
their fresh K/V are written into the given slots first, then every query attends to the valid
slots at positions <= its own. A full prefill, a sparse recompute and a decode step are the same
call with different tokens, and ``forward_batch`` runs several sequences (each with its own cache)
in one pass: one matrix through the linear layers, attention per sequence.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch
from torch import nn

from fusionrag_llm.kernels import cpu_quant, dispatch
from fusionrag_llm.kernels.cpu_quant import FORMATS
from fusionrag_llm.kernels.rotary import rotate, rotate_cpu
from fusionrag_llm.models.attention_backend import attention_backend, shared_pool
from fusionrag_llm.models.config import ModelConfig
from fusionrag_llm.models.decode_graphs import DecodeGraphs, graphable
from fusionrag_llm.models.fast_decode import DecodeProgram
from fusionrag_llm.models.forward import BatchContext, ForwardOutput, ForwardPass, spans_of
from fusionrag_llm.models.kv_cache import KVCache
from fusionrag_llm.models.linear import FusedLinears, Linear, quantized_linears
from fusionrag_llm.models.rotary import RotaryTable

__all__ = ["DECODE_WEIGHTS", "DecoderLM", "ForwardOutput", "ForwardPass"]

logger = logging.getLogger(__name__)

# Weights that decode steps read: float (the model's own), or GGUF-style blocks (kernels/cpu_quant.py).
# "q4" keeps the output head (the tied embedding) in 8 bits, as GGUF files of these models do. "auto":
# per layer, 4-bit or 8-bit blocks only where they hold the weight's own numbers (a model converted
# from a GGUF file), else float: faster decoding that changes nothing.
DECODE_WEIGHTS = ("auto", "float", "q8", "q4")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = "torch"  # the model's backend (``DecoderLM.kernels``): "triton" runs one kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.rms_norm(x, self.weight, self.eps, backend=self.kernels)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + delta, self(x + delta))``: a residual add and this norm (one kernel on the Triton backend)."""
        return dispatch.add_rms_norm(x, delta, self.weight, self.eps, backend=self.kernels)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, q_size, bias=cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, kv_size, bias=cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=False)
        self.qkv = FusedLinears(self.q_proj, self.k_proj, self.v_proj)  # one call in quantized decode steps
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [heads, n, d], k and v [kv_heads, n, d]; q/k normed (Qwen3) but not yet rotated."""
        n, cfg = x.shape[0], self.cfg
        q, k, v = self.qkv(x)
        q = q.view(n, cfg.num_heads, cfg.head_dim)
        k = k.view(n, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(n, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

    def forward(self, x: torch.Tensor, batch: BatchContext) -> torch.Tensor:
        q, k, v = self.project(x)
        batch.capture_raw_kv(k, v)
        q, k = _rotate_qk(batch, q, k)
        batch.capture_queries(self.layer, q)
        out = batch.attend(self.layer, q, k, v)  # [heads, n, d]
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], -1))


def _rotate_qk(batch: BatchContext, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [heads, n, d] and k [kv_heads, n, d] rotated to their positions: in one call where k's heads follow
    q's in one buffer (the output of fused q|k|v projections, as on CUDA), else one call each."""
    size = q.element_size()
    adjacent = (q.dtype == k.dtype and q.stride() == k.stride() and q.shape[1:] == k.shape[1:]
                and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
                and k.data_ptr() == q.data_ptr() + q.shape[0] * q.stride(0) * size)  # fmt: skip
    if not adjacent:
        return batch.rotate(q), batch.rotate(k)
    both = batch.rotate(q.as_strided((q.shape[0] + k.shape[0], *q.shape[1:]), q.stride()))
    return both[: q.shape[0]], both[q.shape[0] :]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = FusedLinears(self.gate_proj, self.up_proj)
        self.kernels = "torch"  # the model's backend (``DecoderLM.kernels``): "triton" runs one kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(dispatch.silu_mul(gate, up, backend=self.kernels))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, batch: BatchContext) -> torch.Tensor:
        h, normed = self.post_attention_layernorm.add(x, self.self_attn(self.input_layernorm(x), batch))
        return h + self.mlp(normed)


class DecoderBody(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # no random init (every caller loads the weights); on the meta device it would also import
        # torch._dynamo for its normal_, about 1 s of every process that loads a model
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, index) for index in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(nn.Module):
    """Causal LM over a ``KVCache``; see the module docstring for the calling convention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTable(cfg.rope, cfg.head_dim)
        self.kernels = "torch"
        self.decode_program: DecodeProgram | None = None  # see quantize_linears
        # decode steps on the CPU run their layers in one compiled call where they can
        # (models/fast_decode.py, built by quantize_linears); False: layer by layer from Python, as
        # every other forward
        self.compiled_decode = True
        # decode steps on CUDA replay captured graphs where they can (models/decode_graphs.py); False:
        # layer by layer from Python
        self.cuda_graphs = True
        self.decode_graphs = DecodeGraphs()  # what it captured: .captured, .failed

    @property
    def kernels(self) -> str:
        """``"torch"`` or ``"triton"``: the backend of attention, rotary, the norms and SwiGLU, set once at load."""
        return self.attention.name

    @kernels.setter
    def kernels(self, name: str) -> None:
        self.attention = attention_backend(name)
        for module in self.modules():  # the norms and SwiGLU too (kernels/elementwise.py)
            if isinstance(module, (RMSNorm, MLP)):
                module.kernels = name

    def pack_linears(self) -> int:
        """Lay every linear weight out for oneDNN's CPU matrix multiply (``models/linear.py``): faster
        decode steps for a second copy of the weights in host memory. Returns how many were packed
        (0 off CPU or below float32, where nothing changes)."""
        return sum(module.pack() for module in self.modules() if isinstance(module, Linear))

    def unpack_linears(self) -> None:
        """Drop the packed copies (``F.linear`` again; their memory is freed)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.unpack()

    def quantize_linears(self, weights: str) -> int:
        """Give decode steps ``weights`` ("auto", "float", "q8" or "q4", see ``DECODE_WEIGHTS``); returns
        how many linear layers got a quantized copy (0 for "float", off CPU, or where the kernel cannot be
        built: then decode stays float and a warning says why). Prefills always use the float weights.
        Also builds the compiled decode step over what decode steps now read (``models/fast_decode.py``)."""
        if weights not in DECODE_WEIGHTS:
            raise ValueError(f"decode weights must be one of {', '.join(DECODE_WEIGHTS)}, got {weights!r}")
        layers = [module for module in self.modules() if isinstance(module, Linear)]
        if weights != "float" and (self.device.type != "cpu" or self.dtype != torch.float32):
            weights = "float"  # the kernel multiplies float32 rows on the CPU
        if weights != "float":
            try:
                cpu_quant.load_library()
            except RuntimeError as exc:
                logger.warning("decode stays float: %s", exc)
                weights = "float"
        fmt = {"float": None, "auto": "exact"}.get(weights, weights)
        count = sum(layer.quantize("q8" if fmt in FORMATS and layer is self.lm_head else fmt) for layer in layers)
        for block in self.model.layers:  # q/k/v and gate/up as one call each where they share a format
            block.self_attn.qkv.fuse()
            block.mlp.gate_up.fuse()
        self.decode_program = DecodeProgram.build(self)
        return count

    def fuse_projections(self) -> int:
        """Each layer's q/k/v and gate/up float weights as one matrix each (``FusedLinears.fuse_float``),
        so a forward makes 4 matrix multiplies per layer instead of 7: fewer kernel launches on a GPU.
        Returns how many groups were fused. Done at load on CUDA; on the CPU, packed and quantized
        weights already serve decode steps."""
        return sum(group.fuse_float() for block in self.model.layers for group in (block.self_attn.qkv, block.mlp.gate_up))

    @property
    def decode_weights(self) -> str:
        """What decode steps read now: "float", "q8" or "q4" (the format of the first layer's weights)."""
        body = self.model.layers[0].mlp.up_proj.quantized if len(self.model.layers) else None
        return body or "float"

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
        done = rotate_cpu(x, cos, sin)  # float32 on the CPU: one compiled pass, the same bits
        return done if done is not None else rotate(x, cos, sin)

    def rotate_into(self, out: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, positions: torch.Tensor,
                    cos_sin=None) -> None:  # fmt: skip
        """``out[..., slots, :] = rotate(x, positions)`` (``x`` [..., n, head_dim], ``out`` [..., capacity,
        head_dim]): a stored entry's keys placed into a cache, in one pass (the Triton kernel writes the
        rotated rows into their slots; on the CPU in float32, the compiled pass). ``cos_sin``: as for
        ``rotate`` (the torch backend's table, when the caller has it)."""
        if self.kernels == "triton":
            try:
                rows = out.view(-1, *out.shape[-2:])  # the leading dims as one, where their strides allow it
            except RuntimeError:
                rows = None
            if rows is not None and x.dtype == out.dtype:
                flat = x.reshape(-1, *x.shape[-2:])
                dispatch.apply_rotary(flat, positions, self.rotary.inv_freq, rows, slots, backend="triton")
                return
            out[..., slots, :] = self.rotate(x, positions)
            return
        cos, sin = cos_sin if cos_sin is not None else self.rotary_cos_sin(positions)
        if rotate_cpu(x, cos, sin, out, slots) is None:
            out[..., slots, :] = rotate(x, cos, sin)

    def _batch(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache],
               offsets: torch.Tensor | None = None) -> tuple[BatchContext, torch.Tensor]:  # fmt: skip
        """The forward's shared metadata and the stacked token embeddings [n_total, hidden]; ``offsets``:
        see ``TritonAttention.prepare_all``. A captured step over one pool writes its positions through
        the pool (its slots from the offsets), so it names no cache of its own: any caches of that pool
        replay it (``models/decode_graphs.py``)."""
        pool = shared_pool(caches) if offsets is not None else None
        for step, cache in zip(steps, caches) if pool is None else ():
            cache.positions[step.slots] = step.positions
            cache.valid[step.slots] = True
            if step.groups is not None:
                cache.groups[step.slots] = step.groups
        outputs = [ForwardOutput(logits=torch.empty(0), raw_keys=[], raw_values=[]) for _ in steps]
        batch = self._context(list(steps), list(caches), outputs, offsets)
        if pool is not None:
            pool.positions[batch.pooled.slots] = batch.pooled.positions
            pool.valid[batch.pooled.slots] = True
        ids = steps[0].token_ids if len(steps) == 1 else torch.cat([s.token_ids for s in steps])
        return batch, self.model.embed_tokens(ids)

    def _context(self, steps: list[ForwardPass], caches: list[KVCache], outputs: list[ForwardOutput],
                 offsets: torch.Tensor | None = None) -> BatchContext:  # fmt: skip
        positions = steps[0].positions if len(steps) == 1 else torch.cat([s.positions for s in steps])
        cos_sin = None if self.kernels == "triton" else self.rotary_cos_sin(positions)
        metas, pooled = self.attention.prepare_all(steps, caches, positions, offsets)
        return BatchContext(
            steps=steps,
            caches=caches,
            spans=spans_of(steps),
            rotate=lambda x: self.rotate(x, positions, cos_sin),
            attention=self.attention,
            metas=metas,
            outputs=outputs,
            cos_sin=cos_sin,
            pooled=pooled,
        )

    def _narrow(self, batch: BatchContext, x: torch.Tensor) -> tuple[BatchContext, torch.Tensor]:
        """Drop the rows a hook no longer wants (``LayerHook.keep``) before the next layer."""
        decided = [_keep(step) is not None for step in batch.steps]
        if not any(decided):
            return batch, x
        steps, rows = [], []
        for step, done, (start, end) in zip(batch.steps, decided, batch.spans):
            keep = _keep(step) if done else None
            steps.append(step.narrowed(keep) if done else step)
            rows.append(torch.arange(start, end, device=x.device) if keep is None
                        else torch.nonzero(keep).flatten() + start)  # fmt: skip
        return self._context(steps, batch.caches, batch.outputs), x[torch.cat(rows)]

    @torch.inference_mode()
    def project_layer(self, step: ForwardPass, cache: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run layers [0, layer) for the step's tokens (writing their KV there), then return their
        rotated queries [heads, n, d], rotated keys and values [kv_heads, n, d] at ``layer`` without
        attending (CacheBlend's layer-1 KV deviation, A3's layer-1 question attention)."""
        batch, x = self._batch([step], [cache])
        for block in self.model.layers[:layer]:
            x = block(x, batch)
        block = self.model.layers[layer]
        q, k, v = block.self_attn.project(block.input_layernorm(x))
        return batch.rotate(q), batch.rotate(k), v

    def project_layer_kv(self, step: ForwardPass, cache: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``project_layer`` without the queries."""
        _, k, v = self.project_layer(step, cache, layer)
        return k, v

    @torch.inference_mode()
    def forward(self, step: ForwardPass, cache: KVCache) -> ForwardOutput:
        return self.forward_batch([step], [cache])[0]

    @torch.inference_mode()
    def forward_batch(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache]) -> list[ForwardOutput]:
        """Several sequences in one pass, each over its own cache; one output per sequence.

        Where the compiled decode call takes some of the steps and not the others (decode tokens beside a
        prefill: a request arriving while others decode), those run as a forward of their own, so a
        sequence's decode step computes the same numbers whoever else is in it."""
        with quantized_linears(all(step.decode for step in steps)):
            return self._forward_batch(steps, caches)

    def _split(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache], taken: list[int]) -> list[ForwardOutput]:
        """The steps ``taken`` as one forward and the others as another, outputs in the steps' order."""
        outputs: list[ForwardOutput | None] = [None] * len(steps)
        chosen = set(taken)
        for group in (taken, [i for i in range(len(steps)) if i not in chosen]):
            for i, out in zip(group, self.forward_batch([steps[i] for i in group], [caches[i] for i in group])):
                outputs[i] = out
        return outputs

    def _forward_batch(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache]) -> list[ForwardOutput]:
        if self.cuda_graphs and self.decode_graphs.failed is None and graphable(self, steps, caches):
            count = len(steps)  # padded to a captured size over pooled caches, whether replayed or not
            steps, caches = self.decode_graphs.padded(steps, caches)
            outputs = self.decode_graphs.run(self, steps, caches, self._weights_key())
            return (outputs if outputs is not None else self._layers(steps, caches))[:count]
        return self._layers(steps, caches)

    def _layers(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache],
                offsets: torch.Tensor | None = None) -> list[ForwardOutput]:  # fmt: skip
        """The step layer by layer (or through the compiled decode program)."""
        batch, x = self._batch(steps, caches, offsets)  # x: [n_total, hidden]
        program = self.decode_program
        taken = program.taken(batch) if self.compiled_decode and program is not None else []
        if taken and not program.current():  # weights changed since it was built: layer by layer
            taken = []
        if 0 < len(taken) < len(steps):
            return self._split(steps, caches, taken)
        if taken:
            x = program.run(x, batch)
        else:
            narrowing = any(step.hooks for step in steps)
            for block in self.model.layers:
                x = block(x, batch)
                if narrowing:
                    batch, x = self._narrow(batch, x)
        rows = [x[start:end] if step.logit_rows is None else x[start:end][step.logit_rows]
                for step, (start, end) in zip(batch.steps, batch.spans)]  # fmt: skip
        # One head matmul for every sequence's rows: the head is the largest weight, read once a step.
        logits = self.lm_head(self.model.norm(rows[0] if len(rows) == 1 else torch.cat(rows))).float()
        for out, part in zip(batch.outputs, logits.split([len(r) for r in rows])):
            out.logits = part
        for step, out in zip(batch.steps, batch.outputs):
            if step.capture_raw_kv:
                out.raw_keys, out.raw_values = torch.stack(out.raw_keys), torch.stack(out.raw_values)
            else:
                out.raw_keys = out.raw_values = None
        return batch.outputs

    def graph_body(self, steps: list[ForwardPass], caches: list[KVCache], offsets: torch.Tensor) -> torch.Tensor:
        """The decode step ``DecodeGraphs`` captures: every sequence's logits [n, vocab], with the attention
        offsets (``attention_backend.span_offsets``) the graph keeps in its own buffer."""
        return torch.cat([out.logits for out in self._layers(steps, caches, offsets)])

    def _weights_key(self) -> tuple[int, ...]:
        """Where the weights and the rotary table are now: a moved or replaced tensor changes it (a graph
        holds their addresses)."""
        return (self.rotary.inv_freq.data_ptr(), *(p.data_ptr() for p in self.parameters()))


def _keep(step: ForwardPass) -> torch.Tensor | None:
    """The rows a hook of ``step`` keeps from the next layer on (None: all)."""
    return next((hook.keep for hook in step.hooks if hook.keep is not None), None)
