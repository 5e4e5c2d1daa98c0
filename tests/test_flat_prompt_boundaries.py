"""Flat prompts keep their own tokens: registering chunks never changes what the model sees.

Random prompts mix registered and unregistered texts with glue that cuts words (a registered text
followed by letters, sitting inside a word, after a space the tokenizer glues to the next word).
Under ``full_attention`` the ids and first-token logits must not depend on whether the chunks are
registered; chunks that do sit on token boundaries are still found and reused, and so are chunks
whose first word the tokenizer glued to the whitespace before them (all but that word).
"""

import random

import pytest
import torch

from fusionrag_llm import FusionRAG, get_method, method_names
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.chunk_finder import MIN_CHUNK_CHARS, ChunkFinder, Piece
from fusionrag_llm.models import tokenizer as tokenizer_module
from fusionrag_llm.models.tokenizer import ChatTokenizer, TokenizedText
from fusionrag_llm.request import prompt_ids
from merging_tokenizer import EMBEDDINGS, GLUE, REGISTERED, UNREGISTERED, bpe_rag, rag_over, registered_twin


def random_prompt(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 5)):
        roll = rng.random()
        if roll < 0.5:
            text = rng.choice(REGISTERED)
        elif roll < 0.7:
            text = rng.choice(UNREGISTERED)
        else:  # a piece of a registered text: cut mid-word at either end
            text = rng.choice(REGISTERED)
            start = rng.randint(0, len(text) // 3)
            text = text[start : rng.randint(start + 1, len(text))]
        parts += [rng.choice(GLUE), text]
    prompt = "".join(parts) + rng.choice(GLUE) + rng.choice(["?", " Why?", "\nAnswer:"])
    return prompt


def registered_finder() -> ChunkFinder:
    """A finder of the registered texts, as the twin's catalog registers them."""
    finder = ChunkFinder()
    finder.register(REGISTERED)
    return finder


def ids_of(rag: FusionRAG) -> dict[str, tuple[int, ...]]:
    """The registered texts' token ids, by text."""
    return {text: rag.chunks[chunk_id_of(text)].token_ids for text in REGISTERED}


def first_logits(rag: FusionRAG, prompt: str) -> torch.Tensor:
    return rag.logits(prompt, [], method="full_attention")[0]


def check_random_prompts(plain: FusionRAG, registered: FusionRAG, count: int, seed: int) -> tuple[int, int, int]:
    """Assert ids and logits agree on ``count`` random prompts; returns how many had a chunk, a refused
    match, and a chunk found after a glued first word."""
    rng, found, refused, glued, finder = random.Random(seed), 0, 0, 0, registered_finder()
    for _ in range(count):
        prompt = random_prompt(rng)
        segments = registered.segments(prompt)
        assert prompt_ids(segments) == prompt_ids(plain.segments(prompt)), prompt
        assert (first_logits(registered, prompt) - first_logits(plain, prompt)).abs().max() <= 1e-5, prompt
        chunks = sum(s.kind == "chunk" for s in segments)
        found += chunks > 0
        refused += len([m for m in finder.matches(prompt) if len(m[1]) >= MIN_CHUNK_CHARS]) > chunks
        glued += any(s.glued_ids for s in segments)
    return found, refused, glued


def test_random_flat_prompts_keep_ids_and_logits_with_the_byte_tokenizer():
    plain = FusionRAG.from_pretrained("tiny", store=":memory:")
    found, _, glued = check_random_prompts(plain, registered_twin(plain), count=200, seed=0)
    assert found >= 60 and glued == 0  # on a byte tokenizer every character edge is a token edge


def test_random_flat_prompts_keep_ids_and_logits_with_a_merging_tokenizer():
    plain = bpe_rag()
    found, refused, glued = check_random_prompts(plain, registered_twin(plain), count=200, seed=1)
    assert found >= 20 and refused >= 5 and glued >= 20  # every path was exercised


def test_chunks_on_token_boundaries_are_found_and_reused():
    rag = registered_twin(bpe_rag())
    prompt = "Context:\n" + REGISTERED[0] + "\n\n" + REGISTERED[3] + "\n\nQuestion: When is the market?"
    segments = rag.segments(prompt)
    assert [s.text for s in segments if s.kind == "chunk"] == [REGISTERED[0], REGISTERED[3]]
    expected = [ids_of(rag)[t] for t in (REGISTERED[0], REGISTERED[3])]
    assert [s.token_ids for s in segments if s.kind == "chunk"] == expected
    out = rag.generate(prompt, method="fusionrag", recompute_ratio=0.2, max_new_tokens=2)
    assert out.stats.path_hits["chunk"] + out.stats.path_hits["exact"] == 2 and out.stats.reused_tokens > 0


def test_chunks_that_cut_a_token_stay_text():
    rag = registered_twin(bpe_rag())
    registered, finder = ids_of(rag), registered_finder()
    # letters glued before, letters glued after (a glued space is taken: see the tests below)
    for prompt in ("Un" + REGISTERED[3], REGISTERED[2] + "ly so", REGISTERED[2] + "s"):
        tokens = rag.tokenizer.tokenize(prompt)
        assert finder.matches(prompt), prompt  # the characters are there, but not the tokens
        assert finder.split_tokens(tokens, registered.get) == [Piece("text", prompt, tuple(tokens.ids))]
        assert all(s.kind != "chunk" for s in rag.segments(prompt))  # and the engine reads it so


# The merging tokenizer reads " Keldmouth" as one token: the space glues to the chunk's first word.
GLUED = "Context: " + REGISTERED[1] + "\n\nQuestion: Which town is on Varrow?"
SELECTING = [name for name in method_names() if get_method(name).selects]


@pytest.fixture(scope="module")
def bpe() -> FusionRAG:
    return bpe_rag()


def test_a_chunk_glued_to_the_space_before_is_found_from_its_second_token(bpe):
    rag = registered_twin(bpe)
    own = ids_of(rag)[REGISTERED[1]]
    segments = rag.segments(GLUED)
    assert prompt_ids(segments) == prompt_ids(bpe.segments(GLUED))  # registering changed no id
    index = [s.kind for s in segments].index("chunk")
    chunk, before = segments[index], segments[index - 1]
    assert chunk.text == REGISTERED[1] and chunk.glued_ids == own[:1] and chunk.token_ids == own[1:]
    # the token before holds the space and the chunk's first token's text, as the tokenizer decodes it
    assert rag.tokenizer.decode(before.token_ids[-1:]) == " " + rag.tokenizer.decode(own[:1])
    out = rag.generate(GLUED, method="full_reuse", max_new_tokens=2, reproducible=True)
    assert out.stats.path_hits == {"exact": 0, "chunk": 1, "miss": 0} and out.stats.unmatched_chunks == 0
    assert out.stats.reused_tokens == len(own) - 1 and out.stats.recomputed_tokens == 0
    assert out.prompt_ids == prompt_ids(segments)


def test_a_glued_chunk_at_ratio_one_equals_full_attention(bpe):
    rag = registered_twin(bpe)
    continuation = bpe.tokenizer.encode(" Keldmouth is")
    full = rag.logits(GLUED, continuation, method="full_attention", reproducible=True)
    for method in SELECTING:
        logits = rag.logits(GLUED, continuation, method=method, recompute_ratio=1.0, reproducible=True)
        assert (logits - full).abs().max().item() <= 1e-5, method
        out = rag.generate(GLUED, method=method, recompute_ratio=1.0, max_new_tokens=1, reproducible=True)
        assert out.stats.path_hits["chunk"] == 1 and out.stats.reused_tokens == 0, method
    reused = rag.logits(GLUED, continuation, method="full_reuse", reproducible=True)
    assert (reused - full).abs().max().item() > 1e-3  # the entry's KV was placed, not recomputed


def test_a_glued_chunk_is_placed_alike_layer_by_layer_and_from_a_packed_entry(bpe):
    """Rows 1.. of the entry, whether placed whole, fed layer by layer, or expanded from int8 first."""
    whole = registered_twin(bpe)
    layerwise = FusionRAG(bpe.engine.loaded, store=":memory:", options={"layerwise_load": True})
    packed = FusionRAG(bpe.engine.loaded, store=":memory:", options={"kv_codec": "int8"})
    continuation = bpe.tokenizer.encode(" Keldmouth")
    expected = whole.logits(GLUED, continuation, method="full_reuse", reproducible=True)
    for rag in (layerwise, packed):
        rag.add_chunks(REGISTERED, embeddings=EMBEDDINGS, neighbors=2)
        out = rag.generate(GLUED, method="full_reuse", max_new_tokens=1, reproducible=True)
        assert out.stats.path_hits["chunk"] == 1 and out.stats.reused_tokens == len(ids_of(rag)[REGISTERED[1]]) - 1
    torch.testing.assert_close(layerwise.logits(GLUED, continuation, method="full_reuse", reproducible=True), expected)
    assert (packed.logits(GLUED, continuation, method="full_reuse", reproducible=True) - expected).abs().max() < 0.1


def test_short_registered_texts_are_not_taken_from_flat_prompts_but_work_in_requests():
    from fusionrag_llm import RAGRequest

    rag = registered_twin(FusionRAG.from_pretrained("tiny", store=":memory:"))
    short = REGISTERED[-1]
    assert len(short) < MIN_CHUNK_CHARS
    assert all(s.kind != "chunk" for s in rag.segments("Context:\n" + short + "\nQ?"))
    request = RAGRequest(chunks=[short], question="Q?")
    assert [s.text for s in rag.segments(request) if s.kind == "chunk"] == [short]


def test_decoding_fallback_finds_the_same_chunks_as_offsets(monkeypatch):
    """Slow tokenizers give no offset mapping; decoding prefixes must give the same pieces."""
    rag = registered_twin(bpe_rag())
    registered, finder = ids_of(rag), registered_finder()
    rng = random.Random(2)
    prompts = [random_prompt(rng) for _ in range(40)]
    with_offsets = [finder.split_tokens(rag.tokenizer.tokenize(p), registered.get) for p in prompts]
    monkeypatch.setattr(rag.tokenizer, "_data_backend", None)  # the slow-tokenizer path: no offsets
    for prompt, expected in zip(prompts, with_offsets):
        assert finder.split_tokens(rag.tokenizer.tokenize(prompt), registered.get) == expected, prompt
    assert sum(kind == "chunk" for pieces in with_offsets for kind, *_ in pieces) >= 10


def test_token_boundaries_from_an_offset_map_follow_their_definition():
    """``index_at(c)`` is the smallest k whose tokens before end at or before c and whose tokens from k
    on start at or after it (else None), for offset maps with shared spans (the bytes of one character),
    gaps and, as some tokenizers give, spans out of order."""
    rng = random.Random(5)
    for _ in range(300):
        length, offsets, at = rng.randint(0, 40), [], 0
        while at < length:
            end = min(length, at + rng.randint(1, 4))
            offsets += [(at, end)] * rng.choice([1, 1, 1, 2, 3])
            at = end + rng.choice([0, 0, 0, 1])
        if offsets and rng.random() < 0.3:  # an out-of-order span somewhere
            i = rng.randrange(len(offsets))
            offsets[i] = (max(0, offsets[i][0] - rng.randint(1, 5)), offsets[i][1])
        tokens = TokenizedText("x" * length, list(range(len(offsets))), offsets, lambda ids: "")
        for char in range(length + 2):
            valid = [k for k in range(len(offsets) + 1)
                     if all(end <= char for _, end in offsets[:k]) and all(start >= char for start, _ in offsets[k:])
                     and char <= length]  # fmt: skip
            assert tokens.index_at(char) == (valid[0] if valid else None), (offsets, char)


LONG_TEXT_PARTS = [*REGISTERED, *UNREGISTERED, *GLUE, "\n", "\n", ".\n\n", "it's\n", "1887\n", "Varrow\n",
                   "caf\u00e9\n", " \n", "\t\n", "?\n  ", "\u00a0\n", "''\n", "(x)\n", "\u4e2d\u6587\n"]  # fmt: skip


class _BatchSpy:
    """A tokenizer backend that counts the texts of its batch calls and passes everything on."""

    def __init__(self, backend):
        self.backend, self.batched = backend, []

    def encode_batch(self, texts, **kwargs):
        self.batched.append(len(texts))
        return self.backend.encode_batch(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def check_long_texts_in_pieces(tokenizer, monkeypatch, seed: int, count: int) -> None:
    """Long random texts (line breaks after letters, digits, signs, spaces, non-ASCII letters and
    quotes): tokenized in pieces in one batch call, the same ids as one call, and the same token
    boundaries as decoding prefixes finds. Texts over 60 characters, not 8k, cut into pieces of at least
    4, not 256, so that nearly every line break the rule may cut at is cut at; nothing kept in memory,
    so every piece is encoded."""
    monkeypatch.setattr(tokenizer_module, "CUT_CHARS", 60)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 4)
    monkeypatch.setattr(tokenizer, "encoded", tokenizer_module.EncodedTexts(budget=0))
    spy = _BatchSpy(tokenizer._data_backend)
    monkeypatch.setattr(tokenizer, "_data_backend", spy)
    rng = random.Random(seed)
    for _ in range(count):
        text = "".join(rng.choice(LONG_TEXT_PARTS) for _ in range(rng.randint(50, 400)))
        tokens = tokenizer.tokenize(text)
        assert spy.batched and spy.batched[-1] > 1, "a long text should be cut"
        assert tokens.ids == tokenizer.encode(text)
        for char in rng.sample(range(len(text) + 1), 40):
            k = tokens.index_at(char)
            if k is not None:
                assert tokenizer.decode(tokens.ids[:k], skip_special_tokens=False) == text[:char]
        spy.batched.clear()


def test_a_long_text_is_tokenized_in_pieces_with_the_ids_of_one_call(monkeypatch):
    """A GPT-2-style tokenizer trained on such texts, so it merges whitespace runs, line breaks and the
    letters, signs and spaces around them: a cut in the wrong place would change its ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from fusionrag_llm.models.tiny import SPECIAL_TOKENS

    rng = random.Random(3)
    corpus = ["".join(rng.choice(LONG_TEXT_PARTS) for _ in range(60)) for _ in range(300)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer, core.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2000, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", additional_special_tokens=list(SPECIAL_TOKENS))
    check_long_texts_in_pieces(ChatTokenizer(hf), monkeypatch, seed=4, count=60)


def test_passages_sent_again_are_pieces_encoded_before_with_the_ids_of_one_call(monkeypatch):
    """A long message's pieces are about paragraphs: a passage sent again after the same separator is a
    piece the tokenizer encoded before (per tenant), read from memory; the message's ids and token
    boundaries are still those of one call."""
    monkeypatch.setattr(tokenizer_module, "CUT_CHARS", 200)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 20)
    tokenizer = bpe_rag().tokenizer
    monkeypatch.setattr(tokenizer, "encoded", tokenizer_module.EncodedTexts())
    spy = _BatchSpy(tokenizer._data_backend)
    monkeypatch.setattr(tokenizer, "_data_backend", spy)
    rng = random.Random(7)
    passages = ["".join(rng.choice(LONG_TEXT_PARTS[:8]) for _ in range(12)).replace("\n", " ").strip() + "."
                for _ in range(6)]  # fmt: skip

    def message(chosen, question):
        return "Context:\n\n" + "\n\n".join(passages[i] for i in chosen) + "\n\nQuestion: " + question

    first = tokenizer.tokenize(message([0, 1, 2, 3], "where?"), "acme")
    pieces_first = spy.batched[-1]
    again = message([2, 0, 4, 1], "when?")
    tokens = tokenizer.tokenize(again, "acme")
    assert spy.batched[-1] < pieces_first  # passages 0 and 2 (after the same separator) came from memory
    assert tokens.ids == tokenizer.encode(again) and first.ids == tokenizer.encode(message([0, 1, 2, 3], "where?"))
    for char in range(len(again) + 1):
        k = tokens.index_at(char)
        if k is not None:
            assert tokenizer.decode(tokens.ids[:k], skip_special_tokens=False) == again[:char]
    before = spy.batched[-1]
    assert tokenizer.tokenize(again, "other").ids == tokens.ids and spy.batched[-1] > before  # another tenant's: encoded


def test_a_tokenizer_that_splits_otherwise_gets_the_long_text_in_one_call(monkeypatch):
    """No cut unless the split rule is GPT-2's and nothing comes before it: the byte tokenizer (no
    split rule) and a tokenizer with a plain added word (taken out of data before the split)."""
    from fusionrag_llm.models.tiny import byte_tokenizer

    text = "Word.\n" * 5000
    merging = bpe_rag().tokenizer.hf
    merging.add_tokens(["Word"])  # not special: it would be cut out of data first
    for tokenizer in (ChatTokenizer(byte_tokenizer()), ChatTokenizer(merging)):
        spy = _BatchSpy(tokenizer._data_backend)
        monkeypatch.setattr(tokenizer, "_data_backend", spy)
        assert tokenizer.tokenize(text).ids == tokenizer.encode(text) and spy.batched == []


def test_old_character_split_is_unchanged():
    finder = ChunkFinder()
    finder.register(["a registered chunk of text", "tiny"])
    expected = [("text", "x "), ("chunk", "a registered chunk of text"), ("text", "s")]
    assert finder.split("x a registered chunk of texts") == expected


@pytest.mark.real_model
def test_smollm2_tokenizer_random_prompts_keep_ids_and_logits():
    """The real SmolLM2 tokenizer over random tiny weights: ids and logits never depend on registration."""
    from transformers import AutoTokenizer

    from fusionrag_llm.models.default_model import resolve_default_model

    plain = rag_over(AutoTokenizer.from_pretrained(resolve_default_model()), "tiny-smollm2-tokenizer")
    found, refused, glued = check_random_prompts(plain, registered_twin(plain), count=60, seed=3)
    assert found >= 5 and refused >= 5 and glued >= 5


@pytest.mark.real_model
def test_smollm2_tokenizer_cuts_long_texts_into_pieces_with_the_ids_of_one_call(monkeypatch):
    from transformers import AutoTokenizer

    from fusionrag_llm.models.default_model import resolve_default_model

    tokenizer = ChatTokenizer(AutoTokenizer.from_pretrained(resolve_default_model()))
    check_long_texts_in_pieces(tokenizer, monkeypatch, seed=5, count=60)


@pytest.mark.real_model
def test_smollm2_context_prefix_keeps_the_prompt(smollm2_rag):
    """"Context: <passage>": SmolLM2 glues the space to the passage's first word (" The", where the
    passage alone starts "The"), so the passage is a chunk from its second token on, and full attention
    sees exactly the unregistered prompt; after a newline it is a chunk whole. At r = 1 both equal
    full attention."""
    passage = "The lighthouse at Grey Point on Varrow was lit for the last time on 3 March 1961, after a storm."
    glued = "Context: " + passage + "\nWhen was it lit last?"
    separate = "Context:\n" + passage + "\nWhen was it lit last?"
    before = {p: (prompt_ids(smollm2_rag.segments(p)), first_logits(smollm2_rag, p)) for p in (glued, separate)}
    smollm2_rag.add_chunks([passage], embeddings=[[1.0, 0.0]], neighbors=1)
    for prompt, (ids, logits) in before.items():
        assert prompt_ids(smollm2_rag.segments(prompt)) == ids
        assert (first_logits(smollm2_rag, prompt) - logits).abs().max() <= 1e-4
    own = smollm2_rag.tokenizer.encode(passage)
    chunks = {p: [s for s in smollm2_rag.segments(p) if s.kind == "chunk"] for p in (glued, separate)}
    assert [(s.glued_ids, s.token_ids) for s in chunks[glued]] == [(tuple(own[:1]), tuple(own[1:]))]
    assert [(s.glued_ids, s.token_ids) for s in chunks[separate]] == [((), tuple(own))]
    for prompt, (_, logits) in before.items():
        again = smollm2_rag.logits(prompt, [], method="fusionrag", recompute_ratio=1.0, reproducible=True)[0]
        assert (again - logits).abs().max() <= 1e-4
