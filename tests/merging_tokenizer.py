"""A random tiny model whose tokenizer has merges, and the texts it learned them from: registered
texts, unregistered ones and the glue that joins them in the flat-prompt tests."""

from fusionrag_llm import FusionRAG
from fusionrag_llm.models.config import config_from_hf
from fusionrag_llm.models.llama import DecoderLM
from fusionrag_llm.models.loader import LoadedModel
from fusionrag_llm.models.tiny import SPECIAL_TOKENS, tiny_hf_config, tiny_state_dict
from fusionrag_llm.models.tokenizer import CHATML_TEMPLATE, ChatTokenizer

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
