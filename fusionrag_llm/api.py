"""The ``FusionRAG`` facade: load a model, register chunks offline, answer requests online."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from fusionrag_llm.engine.llm_engine import Generation, LLMEngine
from fusionrag_llm.engine.streaming import GenerationStream
from fusionrag_llm.engine.context_index import ContextIndex, order_hint
from fusionrag_llm.engine.sampling import SamplingParams
from fusionrag_llm.engine.tenants import PerTenant
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.catalog import ChunkCatalog, catalog_file, chunk_id_of
from fusionrag_llm.fusion.chunk_view import RegisteredChunks, StoredEntry, read_stored
from fusionrag_llm.fusion.entry_store import EntryStore
from fusionrag_llm.fusion.offline import IngestReport, add_chunks
from fusionrag_llm.fusion.embeddings import Embedder, default_embedder
from fusionrag_llm.methods import Method, make_plan
from fusionrag_llm.models.default_model import DEFAULT_MODEL
from fusionrag_llm.models.fingerprint import fingerprint_of
from fusionrag_llm.models.loader import LoadedModel, load_model
from fusionrag_llm.models.prefix_cache import PrefixCache
from fusionrag_llm.models.tokenizer import ChatPart
from fusionrag_llm.options import EngineOptions
from fusionrag_llm.request import (ChatRequest, RAGRequest, Segment, TextPrompt, build_segments, check_tenant,
                                   validate_messages)  # fmt: skip
from fusionrag_llm.paths import remote_secret, remote_trusted, remote_url, store_dir
from fusionrag_llm.storage import StoreConfigError, StoreDamagedError
from fusionrag_llm.storage.store import StoreSpec, open_store

Request = RAGRequest | str | Sequence[dict] | TextPrompt | ChatRequest


class FusionRAG:
    """Answer questions over retrieved chunks with a local model, reusing chunk KV caches.

    >>> rag = FusionRAG.from_pretrained("tiny")
    >>> ids = rag.add_chunks(["Paris is in France.", "Lyon is in France too."], embeddings=[[1, 0], [1, 1]])
    >>> out = rag.generate(RAGRequest(chunks=["Lyon is in France too.", "Paris is in France."],
    ...                               question="Where is Paris?"), method="fusionrag", max_new_tokens=4)
    >>> out.stats.path_hits, out.stats.recomputed_tokens > 0  # a new store keeps bf16 entries: both reused
    ({'exact': 0, 'chunk': 2, 'miss': 0}, True)
    """

    def __init__(self, loaded: LoadedModel, store: StoreSpec = None, embedder: Embedder | None = None,
                 options: EngineOptions | dict | None = None):  # fmt: skip
        options = EngineOptions.of(options)
        self._loaded = loaded
        self.store = _open_store(store, loaded.model.device, options)
        self.embedder = embedder
        fingerprint = fingerprint_of(loaded.name, loaded.source, loaded.hf_config, loaded.tokenizer.hf, loaded.model.dtype)
        s0_ids = self.segments(RAGRequest(chunks=["-"], question="-"))[0].token_ids
        entry_store = EntryStore.of(self.store, fingerprint, s0_ids, loaded.model.dtype, loaded.model.cfg.kv_shape)
        # each tenant's registered chunks (``catalog.jsonl`` for the default tenant) and RAGBoost's record
        # of the orders its earlier requests were given
        self._catalogs = PerTenant(lambda tenant: ChunkCatalog(self.store.record_log(catalog_file(tenant)),
                                                               self.tokenizer.encode))  # fmt: skip
        self._context_indexes = PerTenant(lambda tenant: ContextIndex())
        self.engine = LLMEngine(loaded, entry_store, prefix_cache=options.prefix_cache,
                                auxiliary=_auxiliary(options.auxiliary, loaded), turns=turn_cache(options.turn_cache_gib),
                                craft_variants=options.craft_variants, layerwise_load=options.layerwise_load,
                                reproducible=options.reproducible)  # fmt: skip

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = DEFAULT_MODEL, *, device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None, store: StoreSpec = None,
                        embedder: Embedder | None = None,
                        options: EngineOptions | dict | None = None) -> "FusionRAG":  # fmt: skip
        """Load a model and open its KV store.

        ``name_or_path``: ``"smollm2-135m"`` (default), ``"tiny"``, a model folder, a ``.gguf`` file
        or a hub id. ``store``: a folder (default: ``$FUSIONRAG_STORE`` or the user cache),
        ``":memory:"``, or a ``TieredStore``. ``embedder``: the chunk embedding model (default: the
        packaged all-MiniLM-L6-v2). ``options``: every other setting, an ``EngineOptions`` or a dict of
        its fields (kernels, CPU decoding, the prefix and turn caches, the store's codec and remote tier).
        """
        options = EngineOptions.of(options)
        loaded = load_model(name_or_path, device=device, dtype=dtype, kernels=options.kernels,
                            decode_weights=options.decode_weights)  # fmt: skip
        return cls(loaded, store=store, embedder=embedder, options=options)

    @property
    def tokenizer(self):
        return self._loaded.tokenizer

    @property
    def context_window(self) -> int:
        return self._loaded.context_window

    @property
    def model_name(self) -> str:
        """The name the model was loaded under (a built-in name, a folder, a file or a hub id)."""
        return self._loaded.name

    @property
    def fingerprint(self) -> str:
        """The model fingerprint every stored entry of this engine is keyed by."""
        return self.engine.keys.fingerprint

    @property
    def chunks(self) -> RegisteredChunks:
        """The default tenant's registered chunks, a read-only mapping from chunk id to ``ChunkInfo``
        (``chunk_id``, ``text``, ``token_ids``, ``neighbor_ids``: the chunks its fused entry was computed
        after). Another tenant's: ``chunks_of(tenant)``.

        >>> rag = FusionRAG.from_pretrained("tiny", store=":memory:")
        >>> ids = rag.add_chunks(["Paris is in France.", "Lyon is in France too."], embeddings=[[1, 0], [1, 1]])
        >>> len(rag.chunks), rag.chunks[ids[0]].text, rag.chunks[ids[0]].neighbor_ids == (ids[1],)
        (2, 'Paris is in France.', True)
        """
        return self.chunks_of(None)

    def chunks_of(self, tenant: str | None) -> RegisteredChunks:
        """The chunks registered under ``tenant`` (None: the default tenant), as ``chunks`` shows them.

        >>> rag = FusionRAG.from_pretrained("tiny", store=":memory:")
        >>> ids = rag.add_chunks(["Paris is in France."], embeddings=[[1, 0]], tenant="acme")
        >>> ids[0] in rag.chunks_of("acme"), ids[0] in rag.chunks
        (True, False)
        """
        tenant = check_tenant(tenant)
        return RegisteredChunks(self._catalogs[tenant], self.engine.tenants[tenant].keys, self.engine.lock)

    def stored(self, chunk: str | Sequence[int], variant: str = "plain", tenant: str | None = None) -> StoredEntry | None:
        """This model's stored ``variant`` entry (``"plain"`` or ``"fused"``) of a chunk, given by its
        chunk id or its token ids (a chunk computed on a miss is stored without being registered).
        Read and checked as a request reads it; returns a ``StoredEntry`` (``key``, ``tier``, a copy
        of the ``entry``), or None when the store has none. ``tenant``: whose entry (None: the default
        tenant's; a chunk id must be registered under it).

        >>> rag = FusionRAG.from_pretrained("tiny", store=":memory:")
        >>> ids = rag.add_chunks(["Paris is in France."], embeddings=[[1, 0]])
        >>> found = rag.stored(ids[0], "fused")
        >>> found.tier, found.entry.token_ids == rag.chunks[ids[0]].token_ids, found.entry.meta["variant"]
        ('host', True, 'fused')
        """
        tenant = check_tenant(tenant)
        return read_stored(self.engine.tenants[tenant].entry_store, self.chunks_of(tenant), chunk, variant)

    def add_chunks(self, texts: Sequence[str], fuse: bool = True, neighbors: int = 10,
                   embeddings=None, progress: bool = False, variant_notes: bool = False,
                   workers: int | None = None, pause: Callable[[], None] | None = None,
                   tenant: str | None = None) -> IngestReport:  # fmt: skip
        """Offline stage: store plain (and fused) entries of ``texts``; returns their chunk ids (an
        ``IngestReport``: a list of the ids, with ``plain_computed`` and ``fused_computed``).

        ``embeddings`` ([len(texts), dim]) skip the embedding model (e.g. a vector store's own).
        ``variant_notes``: fused entries also carry the notes the ``cache_craft`` method reads (about
        70% more time per fused entry). Calling it again with the same texts computes nothing.
        ``workers``: compute the entries in that many Ray worker processes writing into this engine's
        store folder (the ``distributed`` extra; ``engine/ray_ingest.py``); None: in this process.
        ``tenant``: register them under this tenant only (None: the default tenant); their fused
        neighbours are chosen among that tenant's chunks, and only its requests reuse their entries.

        In this process the engine lock is held piece by piece (one entry each), not for the whole
        call, and not while texts are embedded: requests on other threads step in between.
        ``pause``: called between pieces with the lock released (the server lets its waiting
        requests run a while there).
        """
        if not isinstance(variant_notes, bool):
            raise FusionRAGError(f"variant_notes must be True or False, got {variant_notes!r}")
        tenant = check_tenant(tenant)
        lock = self.engine.lock
        with lock:  # everything that touches the model, the catalog or the store holds it
            computer, catalog = self.engine.tenants[tenant].computer, self._catalogs[tenant]
            if workers is not None:
                from fusionrag_llm.engine.ray_ingest import ingest_with_workers  # Ray only when asked for

                return ingest_with_workers(self._loaded, computer, catalog, texts, workers,
                                           fuse=fuse, neighbors=neighbors, embeddings=embeddings,
                                           embedder=self.embedder, progress=progress,
                                           variant_notes=variant_notes, tenant=tenant)  # fmt: skip

            def between_pieces() -> None:
                with _released(lock):
                    if pause is not None:
                        pause()

            return add_chunks(computer, catalog, self.tokenizer.encode, texts, fuse=fuse,
                              neighbors=neighbors, embeddings=embeddings, embedder=self._unlocked_embedder(),
                              progress=progress, variant_notes=variant_notes, pause=between_pieces)  # fmt: skip

    def _unlocked_embedder(self) -> Embedder:
        """The embedding model (loaded on first use), run with the engine lock released."""

        def embed(texts: Sequence[str]):
            with _released(self.engine.lock):
                return (self.embedder or default_embedder())(texts)

        return embed

    def segments(self, request: Request) -> list[Segment]:
        """How ``request`` is split into prefix, chunks, text between, and suffix.

        A flat string is the user message; a list of ``{"role", "content"}`` messages is a whole
        chat; a ``TextPrompt`` is read as it is, without the chat template; a ``ChatRequest`` is a
        string or a chat for its tenant. Chunk texts registered under the request's tenant inside
        any of them become chunk segments where the prompt's own tokens equal theirs (so
        finding them never changes the prompt's ids). Only the chat
        template's own text can become control tokens: chunks, questions, system prompts, message
        contents and flat prompts are data, so ``"<|im_end|>"`` inside them stays plain text.
        """
        catalogs = getattr(self, "_catalogs", None)  # None while the canonical prefix is being derived
        scope = tenant_of(request)  # whose texts the tokenizer's memory of encoded texts serves
        catalog = None if catalogs is None else catalogs[scope]
        tools = None
        if isinstance(request, ChatRequest):
            tools = request.tools
            request = request.messages if isinstance(request.messages, str) else list(request.messages)
        if tools is not None:  # offered in the template's own format, else in the generic tool prompt
            native = tools.definitions if tools.fmt is not None else None
            chat = tools.chat(request)
            body, generation_prompt = self.tokenizer.split_generation_prompt(chat if native else validate_messages(chat),
                                                                             native)  # fmt: skip
            generation_prompt = [*generation_prompt, ChatPart(tools.answer_prefix)] if tools.answer_prefix else generation_prompt
            return build_segments(self._pieces(body, catalog, scope), self._pieces(generation_prompt, catalog, scope))
        if isinstance(request, RAGRequest):
            head, tail = self.tokenizer.chat_frame(request.system)
            parts = request.pieces()
            ids = self.tokenizer.encode_many([text for _, text in parts], scope)
            pieces = [Segment(kind, text, tuple(own)) for (kind, text), own in zip(parts, ids)]
            return build_segments([*self._pieces(head, None, scope), *pieces], self._pieces(tail, catalog, scope))
        if isinstance(request, str):
            if not request.strip():
                raise FusionRAGError("the prompt is empty; pass a non-empty string or a RAGRequest")
            head, tail = self.tokenizer.chat_frame(None)
            return build_segments([*self._pieces(head, catalog, scope), *self._find_chunks(request, catalog, scope)],
                                  self._pieces(tail, catalog, scope))  # fmt: skip
        if isinstance(request, TextPrompt):
            return build_segments(self._raw_pieces(request.text, catalog, scope))
        if isinstance(request, (list, tuple)):
            body, generation_prompt = self.tokenizer.split_generation_prompt(validate_messages(request))
            return build_segments(self._pieces(body, catalog, scope), self._pieces(generation_prompt, catalog, scope))
        raise FusionRAGError(f"a request must be a RAGRequest, a prompt string, a list of chat messages, a TextPrompt "
                             f"or a ChatRequest, got {type(request).__name__}")  # fmt: skip

    def _pieces(self, parts: Sequence[ChatPart], catalog: ChunkCatalog | None, scope: str) -> list[Segment]:
        """Template text with its control tokens; message contents as data, with ``catalog``'s chunks
        found in them (None: none looked for); ``scope``: the tenant."""
        pieces = []
        for part in parts:
            if part.message is None:
                pieces.append(Segment("text", part.text, tuple(self.tokenizer.encode_template(part.text))))
            else:
                pieces += self._find_chunks(part.text, catalog, scope)
        return pieces

    def _raw_pieces(self, text: str, catalog: ChunkCatalog | None, scope: str) -> list[Segment]:
        """A raw prompt's pieces. The engine needs tokens before the first chunk (its prefix) and after
        the last (the suffix, whose queries guide the selection), so a chunk at either end is read
        as plain text (computed, not reused); the prompt's ids do not change."""
        pieces = self._find_chunks(text, catalog, scope)
        for end in (0, -1):
            if pieces[end].kind == "chunk":
                pieces[end] = Segment("text", pieces[end].text, pieces[end].token_ids)
        return pieces

    def _find_chunks(self, text: str, catalog: ChunkCatalog | None, scope: str) -> list[Segment]:
        tokens = self.tokenizer.tokenize(text, scope)
        if catalog is not None:
            catalog.refresh()  # chunks other processes registered since (reads only new lines)
        if catalog is None or not len(catalog):
            return [Segment("text", text, tuple(tokens.ids))]
        return [Segment(*piece) for piece in catalog.finder.split_tokens(tokens, lambda t: _registered_ids(catalog, t))]

    def _locked_segments(self, request: Request) -> list[Segment]:
        """``segments`` while no other thread ingests (the catalog it reads may be growing)."""
        with self.engine.lock:
            return self.segments(request)

    def stream(self, request: Request, method: str | Method = "fusionrag", recompute_ratio: float | None = None,
               max_new_tokens: int = 32, *, stop: str | Sequence[str] | None = None,
               sampling: SamplingParams | dict | None = None, reproducible: bool | None = None) -> GenerationStream:  # fmt: skip
        """Like ``generate``, but iterate the result for text deltas as they are decoded.

        >>> rag = FusionRAG.from_pretrained("tiny")
        >>> stream = rag.stream("Say hi", method="full_attention", max_new_tokens=3)
        >>> "".join(stream) == stream.text and len(stream.token_ids) <= 3
        True
        """
        plan = make_plan(method, recompute_ratio, reproducible)
        return self.engine.stream(self._locked_segments(request), plan, max_new_tokens, stop=stop,
                                  sampling=sampling, tenant=tenant_of(request))  # fmt: skip

    def generate(self, request: Request, method: str | Method = "fusionrag", recompute_ratio: float | None = None,
                 max_new_tokens: int = 32, *, stop: str | Sequence[str] | None = None,
                 sampling: SamplingParams | dict | None = None, n: int = 1,
                 reproducible: bool | None = None) -> Generation:  # fmt: skip
        """Answer ``request``; ``out.stats`` holds TTFT, its parts and token counts.

        ``method``: a name of ``method_names()`` or a ``Method`` (with options, e.g.
        ``get_method("a3", decode_kv_budget=128)``); ``recompute_ratio``: the share of reused chunk
        tokens recomputed, default the method's own (0.15 for ``fusionrag``). ``stop``: a string or up
        to 16 strings that end the answer where one first appears (``out.finish_reason`` is then
        ``"stop"``). ``sampling``: a ``SamplingParams`` or a dict of its fields (``temperature``,
        ``top_p``, ``top_k``, ``min_p``, the penalties, ``seed``, ``stop_token_ids``, ``ignore_eos``);
        default greedy. ``n``: answers drawn from one prefill (``out.others`` holds answers 2..n).
        ``reproducible``: True answers from the stored chunk entries and the prompt prefix's KV only, never
        from exact or turn KV earlier requests left, so the answer does not depend on what ran before
        (None: the engine option ``reproducible``, default False).
        RAGBoost's context ordering is ``rag.generate(rag.ordered(request))``.

        >>> rag = FusionRAG.from_pretrained("tiny")
        >>> a = rag.generate("Say hi", method="full_attention", max_new_tokens=4, sampling={"temperature": 0.8, "seed": 7})
        >>> b = rag.generate("Say hi", method="full_attention", max_new_tokens=4, sampling={"temperature": 0.8, "seed": 7})
        >>> a.token_ids == b.token_ids
        True
        """
        plan = make_plan(method, recompute_ratio, reproducible)
        return self.engine.generate(self._locked_segments(request), plan, max_new_tokens, stop=stop,
                                    sampling=sampling, n=n, tenant=tenant_of(request))  # fmt: skip

    def generate_many(self, requests: Sequence[Request], method: str | Method = "fusionrag",
                      recompute_ratio: float | None = None, max_new_tokens: int = 32, *,
                      stop: str | Sequence[str] | None = None, sampling: SamplingParams | dict | None = None,
                      reproducible: bool | None = None) -> list[Generation]:  # fmt: skip
        """Answer several requests as one batch: their prefills are admitted together and every
        decode step runs all unfinished answers in one forward. Results come in request order and
        equal answering each alone (greedy decoding; with a seeded ``sampling``, each request draws
        from its own stream).

        The entries of the next waiting requests load from the store on a background thread while
        the engine computes: each result's ``stats.prefetch_s`` is that loading and ``stats.wait_s``
        the part of it the engine still had to wait for.
        """
        plan = make_plan(method, recompute_ratio, reproducible)
        batch = [(self._locked_segments(request), plan, max_new_tokens, tenant_of(request)) for request in requests]
        return self.engine.generate_many(batch, stop=stop, sampling=sampling)

    def ordered(self, request: RAGRequest) -> RAGRequest:
        """``request`` as RAGBoost orders it (``engine/context_index.py``): the chunks that earlier ordered
        requests started with first, the rest in retrieval order, and, when the order changed, a note
        giving the retriever's original ranking (documents named by their place in the prompt, or by
        ``format.doc_label`` when set; the prompt is otherwise unchanged, so its first chunk can still
        be the exact one after the canonical prefix). The order is recorded.

        >>> rag = FusionRAG.from_pretrained("tiny")
        >>> first = rag.ordered(RAGRequest(chunks=["A is 1.", "B is 2."], question="A?"))
        >>> second = rag.ordered(RAGRequest(chunks=["C is 3.", "B is 2.", "A is 1."], question="C?"))
        >>> second.chunks, second.note
        (('A is 1.', 'B is 2.', 'C is 3.'), 'Please read the context in the following priority order: document 3 >> document 2 >> document 1 and answer the question.')
        """
        if not isinstance(request, RAGRequest):
            raise FusionRAGError(f"ordered() needs a RAGRequest (its chunks are what is reordered), got {type(request).__name__}")
        order = self._context_indexes[request.tenant].order([chunk_id_of(chunk) for chunk in request.chunks])
        note = "\n".join(filter(None, [request.note, order_hint(order, request.format.doc_label)])) or None
        return replace(request, chunks=[request.chunks[index] for index in order], note=note)

    def logits(self, request: Request, continuation_ids: Sequence[int], method: str | Method = "fusionrag",
               recompute_ratio: float | None = None, *, reproducible: bool | None = None) -> torch.Tensor:  # fmt: skip
        """Teacher-forced logits ``[len(continuation_ids) + 1, vocab]`` (float32) for fidelity measurements.

        ``continuation_ids`` must be ints in ``[0, vocab)``; anything else is refused before any compute.
        """
        plan = make_plan(method, recompute_ratio, reproducible)
        return self.engine.logits(self._locked_segments(request), continuation_ids, plan,
                                  tenant_of(request))  # checks the ids first


def tenant_of(request: Request) -> str:
    """The tenant ``request`` is answered for: its ``tenant`` field, or the default tenant (``""``) for
    a bare string or list of messages."""
    if isinstance(request, (RAGRequest, TextPrompt, ChatRequest)):
        return request.tenant
    return ""


def _registered_ids(catalog: ChunkCatalog, text: str) -> tuple[int, ...] | None:
    chunk = catalog.get(text)
    return None if chunk is None else chunk.token_ids


class DamagedStoreError(FusionRAGError, StoreDamagedError):
    """The store's index is damaged; the message names the file and the commands that fix it."""


def _open_store(store: StoreSpec, device: torch.device, options: EngineOptions):
    """``open_store`` with the facade's defaults (the default folder, ``$FUSIONRAG_REMOTE`` and, for a
    remote tier, ``$FUSIONRAG_REMOTE_SECRET`` / ``$FUSIONRAG_REMOTE_TRUSTED`` unless the options give
    either) and errors."""
    remote = remote_url() if options.remote is None else options.remote
    try:
        secret, trusted = _remote_auth(options) if remote else (None, False)
        return open_store(store_dir() if store is None else store, device, remote=remote, kv_codec=options.kv_codec,
                          remote_secret=secret, remote_trusted=trusted)  # fmt: skip
    except StoreDamagedError as exc:
        raise DamagedStoreError(exc.directory, exc.problem) from exc
    except StoreConfigError as exc:
        raise FusionRAGError(str(exc)) from None


def _remote_auth(options: EngineOptions) -> tuple[str | None, bool]:
    """``(secret, trusted)`` of the remote tier: the options' when they give either, else the environment's."""
    if options.remote_secret is None and options.remote_trusted is None:
        return remote_secret(), remote_trusted()
    return options.remote_secret, bool(options.remote_trusted)


def turn_cache(gib: float) -> PrefixCache | None:
    """The multi-turn KV cache for a budget in GiB (0: none)."""
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not 0 <= gib < 1024:
        raise FusionRAGError(f"turn_cache_gib must be a number of GiB in [0, 1024), got {gib!r}")
    return PrefixCache(int(gib * 2**30)) if gib > 0 else None


def _auxiliary(value, loaded: LoadedModel):
    """CacheClip's auxiliary model as the engine takes it: a number of layers, or a loaded model."""
    if isinstance(value, FusionRAG):
        return value.engine.loaded
    if isinstance(value, (str, Path)):
        return load_model(value, device=loaded.model.device, dtype=loaded.model.dtype)
    return value


@contextmanager
def _released(lock) -> Iterator[None]:
    """``lock`` (held by this thread) released for the block: one level of it, so a caller that holds
    it around the whole call keeps it."""
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
