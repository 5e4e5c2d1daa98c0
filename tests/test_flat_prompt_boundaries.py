"""Flat prompts keep their own tokens: registering chunks never changes what the model sees.

Random prompts mix registered and unregistered texts with glue that cuts words (a registered text
followed by letters, sitting inside a word, after a space the tokenizer glues to the next word).
Under ``full_attention`` the ids and first-token logits must not depend on whether the chunks are
registered; chunks that do sit on token boundaries are still found and reused.
"""

import random

import pytest
import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.fusion.catalog import chunk_id_of
from fusionrag_llm.fusion.chunk_finder import MIN_CHUNK_CHARS, ChunkFinder
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.models.tiny import SPECIAL_TOKENS, tiny_hf_config, tiny_state_dict
from fusionrag_llm.models.tokenizer import CHATML_TEMPLATE, ChatTokenizer
from fusionrag_llm.request import prompt_ids

REGISTERED = [
    "The ferry to Varrow leaves Keldmouth twice a day in the summer months.",
    "Keldmouth is the only town on the island of Varrow, on its east coast.",
    "island of Varrow, on its east coast",  # inside another registered text
    "The wool market of Varrow takes place every September in Keldmouth.",
    "Tamsin Orrery mapped the tidal caves below the northern cliffs in 1887.",
    "Lowmarch bridge is old.",  # registered, but shorter than MIN_CHUNK_CHARS
]
UNREGISTERED = [
    "Sheep outnumber people on Varrow by about forty to one.",
    "Nobody remembers who built the lighthouse at Grey Point.",
    "Answer briefly.",
]
GLUE = ["", " ", "  ", "\n", "\n\n", ": ", ", ", ". ", "-", "(", ")", '"', "ing", "s", "ly ", "x", "é", "'s",
        "\t", "Context: ", "Context:\n", "\nQuestion: "]  # fmt: skip
# Words the test tokenizer learns as single tokens, so a registered text glued to letters cuts a token.
GLUED_WORDS = ["UnThe", "east coastly", "east coasts"]
EMBEDDINGS = [[1.0, 0.0], [0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.0, 1.0], [0.5, 0.5]]


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


def bpe_rag() -> FusionRAG:
    """A random tiny model whose tokenizer has merges (GPT-2 style pre-tokenizer), so token
    boundaries are not character boundaries and a registered text can sit inside a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)  # fmt: skip
    core.train_from_iterator((REGISTERED + UNREGISTERED + GLUE + GLUED_WORDS) * 20, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                 pad_token="<|endoftext|>", additional_special_tokens=list(SPECIAL_TOKENS))  # fmt: skip
    hf.chat_template = CHATML_TEMPLATE
    return rag_over(hf, "tiny-bpe")


def rag_over(hf, name: str) -> FusionRAG:
    """A fresh engine: random tiny weights sized to ``hf``'s vocabulary, in-memory store."""
    config = tiny_hf_config("llama", vocab_size=len(hf), bos_token_id=hf.convert_tokens_to_ids("<|im_start|>"),
                            eos_token_id=hf.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip
    cfg = config_from_hf(config, name)
    model = DecoderLM(cfg)
    model.load_state_dict(tiny_state_dict(model))
    loaded = LoadedModel(name, model.eval(), ChatTokenizer(hf, cfg.eos_token_ids), config, "built-in")
    return FusionRAG(loaded, store=":memory:")


def registered_twin(rag: FusionRAG) -> FusionRAG:
    twin = FusionRAG(rag.engine.loaded, store=":memory:")
    twin.add_chunks(REGISTERED, embeddings=EMBEDDINGS, neighbors=2)
    return twin


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


def check_random_prompts(plain: FusionRAG, registered: FusionRAG, count: int, seed: int) -> tuple[int, int]:
    """Assert ids and logits agree on ``count`` random prompts; returns (prompts with a chunk, with a refused match)."""
    rng, found, refused, finder = random.Random(seed), 0, 0, registered_finder()
    for _ in range(count):
        prompt = random_prompt(rng)
        segments = registered.segments(prompt)
        assert prompt_ids(segments) == prompt_ids(plain.segments(prompt)), prompt
        assert (first_logits(registered, prompt) - first_logits(plain, prompt)).abs().max() <= 1e-5, prompt
        chunks = sum(s.kind == "chunk" for s in segments)
        found += chunks > 0
        refused += len([m for m in finder.matches(prompt) if len(m[1]) >= MIN_CHUNK_CHARS]) > chunks
    return found, refused


def test_random_flat_prompts_keep_ids_and_logits_with_the_byte_tokenizer():
    plain = FusionRAG.from_pretrained("tiny", store=":memory:")
    found, _ = check_random_prompts(plain, registered_twin(plain), count=200, seed=0)
    assert found >= 60  # on a byte tokenizer every character edge is a token edge


def test_random_flat_prompts_keep_ids_and_logits_with_a_merging_tokenizer():
    plain = bpe_rag()
    found, refused = check_random_prompts(plain, registered_twin(plain), count=200, seed=1)
    assert found >= 20 and refused >= 20  # both paths were exercised


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
    # a space glued to the first word, letters glued before, letters glued after
    for prompt in ("Context: " + REGISTERED[1], "Un" + REGISTERED[3], REGISTERED[2] + "ly so", REGISTERED[2] + "s"):
        tokens = rag.tokenizer.tokenize(prompt)
        assert finder.matches(prompt), prompt  # the characters are there, but not the tokens
        assert finder.split_tokens(tokens, registered.get) == [("text", prompt, tuple(tokens.ids))]
        assert all(s.kind != "chunk" for s in rag.segments(prompt))  # and the engine reads it so


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
    assert sum(kind == "chunk" for pieces in with_offsets for kind, _, _ in pieces) >= 10


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
    found, refused = check_random_prompts(plain, registered_twin(plain), count=60, seed=3)
    assert found >= 5 and refused >= 5


@pytest.mark.real_model
def test_smollm2_context_prefix_keeps_the_prompt(smollm2_rag):
    """"Context: <passage>": SmolLM2 glues the space to the passage's first word, so the passage is
    not a chunk there and full attention sees exactly the unregistered prompt; after a newline it is."""
    passage = "The lighthouse at Grey Point on Varrow was lit for the last time on 3 March 1961, after a storm."
    glued = "Context: " + passage + "\nWhen was it lit last?"
    separate = "Context:\n" + passage + "\nWhen was it lit last?"
    before = {p: (prompt_ids(smollm2_rag.segments(p)), first_logits(smollm2_rag, p)) for p in (glued, separate)}
    smollm2_rag.add_chunks([passage], embeddings=[[1.0, 0.0]], neighbors=1)
    for prompt, (ids, logits) in before.items():
        assert prompt_ids(smollm2_rag.segments(prompt)) == ids
        assert (first_logits(smollm2_rag, prompt) - logits).abs().max() <= 1e-4
    assert [s.kind for s in smollm2_rag.segments(glued)] == ["prefix", "suffix"]
    assert [s.kind for s in smollm2_rag.segments(separate)] == ["prefix", "chunk", "suffix"]
