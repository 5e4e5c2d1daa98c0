"""Decode steps on CUDA replayed from captured CUDA graphs.

A decode step of an 8B model on a GPU launches about a thousand small kernels; launched one by one
from Python they take several times longer than the kernels run. ``DecodeGraphs`` records a step's
kernels once in a CUDA graph and replays it for the following steps of the same sequences: the
launches cost one call per step.

A graph holds raw device addresses, so it is made for one placement of the weights (weights changed
in place are read as they are) and replays only steps that change nothing but the values in its
inputs:

* the step's token ids, positions and slots, copied into the graph's input buffer;
* each cache's first pool slot and used length, in the attention offsets
  (``TritonAttention.prepare_all``): the kernel reads them from the device, so no shape of the step
  depends on them.

Caches of one pool (``models/kv_pool.py``) make a step of one write and one attention call per layer
for all sequences, and every write goes through the pool's buffers at slots read from the offsets:
such a graph is made for a pool and a size (its key: the weights' addresses, the pool's, the size),
and any sequences of that pool replay it, so a batch that changes members keeps its graph. The sizes
are 1, 2, 4, 8 and then multiples of 8 (``captured_size``): a step of fewer sequences is padded up to
its size with rows that write and read only the pool's padding slot (``KVPool.padding``), so a server
whose batch shrinks and grows by one as requests end and arrive replays a few graphs instead of
capturing one per count. The same step runs padded whether it replays or runs eagerly, so a graph
computes what the eager step computes. Separate caches make a write and a call per sequence (in the
graph, still no launch each), at their own addresses: that graph is made for one set of caches (its
key: each cache's buffers and capacity, in order), unpadded.

It takes only a plain decode step: one token per sequence (``ForwardPass.decode``) with no hook,
capture, attention groups, scaling or KV still arriving, on the Triton backend. Anything else, and
any step after a failed capture (a warning says why), runs layer by layer as before, unpadded. The first step of
a new set of sequences runs eagerly (while a batch fills up, each step has new members); the second
captures, running the step once for real first (its writes are the same values the replay writes
again), so a new set of sequences costs two eager steps and one capture. The few most recent graphs are kept, all
in one memory pool: a graph's temporaries (its largest, the logits of up to 256 rows before they are
float32) are free again when its replay ends, so the next graph reuses that memory instead of each
holding its own. That is safe because replays never overlap (one stream) and each replay's output is
copied out before the next replay, which may write over it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import torch

from fusionrag_llm.models.attention_backend import shared_pool, span_offsets
from fusionrag_llm.models.forward import ForwardOutput, ForwardPass
from fusionrag_llm.models.kv_cache import KVCache

if TYPE_CHECKING:
    from fusionrag_llm.models.llama import DecoderLM

logger = logging.getLogger(__name__)

KEPT_GRAPHS = 8  # graphs kept, the most recently used (a batch changes when one ends or joins)
SIZE_STEP = 8  # captured sizes past 8 sequences are its multiples


def captured_size(count: int) -> int:
    """The number of rows a pooled step of ``count`` sequences runs with: 1, 2, 4, 8, then the next multiple
    of ``SIZE_STEP``."""
    if count < 1:
        raise ValueError(f"a step has at least one sequence, got {count}")
    if count <= SIZE_STEP:
        return 1 << (count - 1).bit_length()
    return -(-count // SIZE_STEP) * SIZE_STEP


def graphable(model: DecoderLM, steps: Sequence[ForwardPass], caches: Sequence[KVCache]) -> bool:
    """True for a plain decode step on CUDA through the Triton backend (see the module docstring)."""
    if model.device.type != "cuda" or model.kernels != "triton":
        return False
    plain = all(step.decode and len(step.token_ids) == 1 and step.logit_rows is None and not step.hooks
                and not step.capture_query_layers and not step.capture_raw_kv and step.groups is None
                and step.scaling is None for step in steps)  # fmt: skip
    return plain and all(cache.feed is None for cache in caches)


class DecodeGraphs:
    """The captured decode steps of one model (``DecoderLM.decode_graphs``; ``DecoderLM.cuda_graphs`` turns them off)."""

    def __init__(self) -> None:
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._last: tuple | None = None  # the key of the last step run eagerly
        self.failed: str | None = None  # why capturing failed; then every step runs eagerly
        self._padding: dict[torch.device, ForwardPass] = {}  # a padding row's step, per device
        self._memory: tuple | None = None  # the memory pool every graph is captured into (made at the first capture)

    def padded(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache]) -> tuple[list, list]:
        """``steps`` and ``caches`` with padding rows after them up to ``captured_size``, when the caches share
        one pool (else as they are). A padding row is token 0 at position 0 in the pool's padding slot."""
        steps, caches = list(steps), list(caches)
        pool = shared_pool(caches)
        extra = captured_size(len(steps)) - len(steps) if pool is not None else 0
        if extra == 0:
            return steps, caches
        device = pool.keys.device
        step = self._padding.get(device)
        if step is None:
            zero = torch.zeros(1, dtype=torch.int64, device=device)
            step = self._padding[device] = ForwardPass(zero, zero, zero, decode=True)
        return steps + [step] * extra, caches + [pool.padding] * extra

    @property
    def captured(self) -> int:
        """How many graphs are kept now."""
        return len(self._graphs)

    @property
    def memory_pools(self) -> int:
        """How many memory pools the kept graphs were captured into (one, however many graphs: see the
        module docstring)."""
        return len({graph.graph.pool() for graph in self._graphs.values()})

    def run(self, model: DecoderLM, steps: Sequence[ForwardPass], caches: Sequence[KVCache],
            weights: tuple[int, ...]) -> list[ForwardOutput] | None:  # fmt: skip
        """The step's outputs from a graph (captured now if none was for these caches and ``weights``, the
        addresses of the model's tensors), or None when this model cannot capture (the caller runs the
        step eagerly)."""
        if self.failed is not None:
            return None
        pool = shared_pool(caches)
        if pool is not None:  # any caches of the pool: its buffers and the size
            key = (weights, "pool", pool.keys.data_ptr(), pool.values.data_ptr(), len(caches))
        else:
            key = (weights, *((c.keys.data_ptr(), c.values.data_ptr(), c.positions.data_ptr(), c.valid.data_ptr(),
                               c.groups.data_ptr(), c.capacity) for c in caches))  # fmt: skip
        graph = self._graphs.pop(key, None)
        if graph is None:
            if key != self._last:  # a set of sequences seen once runs eagerly: while a batch fills up,
                self._last = key  # each step has new members, and a capture would not be replayed
                return None
            try:
                self._memory = self._memory or torch.cuda.graph_pool_handle()
                graph = _Graph(model, steps, caches, self._memory)
            except RuntimeError as exc:  # an operation that cannot be captured: eager from now on
                self.failed = f"{type(exc).__name__}: {exc}"
                self._graphs.clear()
                self._memory = None
                logger.warning("decode steps run without CUDA graphs: capturing failed (%s)", self.failed)
                return None
        self._graphs[key] = graph
        while len(self._graphs) > KEPT_GRAPHS:
            self._graphs.popitem(last=False)
        return graph.replay(steps, caches)


class _Graph:
    """One captured decode step over fixed caches; inputs go into its buffers before each replay."""

    def __init__(self, model: DecoderLM, steps: Sequence[ForwardPass], caches: Sequence[KVCache], memory: tuple) -> None:
        n, device = len(caches), model.device
        pool = shared_pool(caches)
        self.pooled = pool is not None  # then the step is one call per layer, through the pool's buffers
        # kept alive: the graph writes into their buffers (the pool's; else these caches')
        self.holds = pool if pool is not None else list(caches)
        self.inputs = torch.empty(3, n, dtype=torch.int64, device=device)  # token ids, positions, slots
        self.offsets = torch.empty(3 * n + 1, dtype=torch.int64, device=device)  # attention_backend.span_offsets
        self.host = torch.empty(3 * n + 1, dtype=torch.int64).pin_memory()
        self.copied = torch.cuda.Event()  # the last copy out of ``host`` is done
        self._fill(steps, caches)
        graph_steps = [ForwardPass(self.inputs[0, i : i + 1], self.inputs[1, i : i + 1], self.inputs[2, i : i + 1],
                                   decode=True) for i in range(n)]  # fmt: skip
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # the step once for real: lazy set-up happens outside the capture
            model.graph_body(graph_steps, list(caches), self.offsets)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=memory):  # the pool all graphs share (see the module docstring)
            self.logits = model.graph_body(graph_steps, list(caches), self.offsets)

    def _fill(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache]) -> None:
        for row, name in enumerate(("token_ids", "positions", "slots")):
            self.inputs[row].copy_(torch.cat([getattr(step, name) for step in steps]))
        self.copied.synchronize()
        self.host.copy_(torch.tensor(span_offsets(caches, self.pooled)))
        self.offsets.copy_(self.host, non_blocking=True)
        self.copied.record()

    def replay(self, steps: Sequence[ForwardPass], caches: Sequence[KVCache]) -> list[ForwardOutput]:
        self._fill(steps, caches)
        self.graph.replay()
        logits = self.logits.clone()  # the next replay (of any graph: one memory pool) may write over the graph's own
        return [ForwardOutput(logits=logits[i : i + 1]) for i in range(len(steps))]
