"""The engine's own forward pass equals `transformers` for every supported family (fp32)."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from fusionrag_llm.models.llama import ForwardPass
from fusionrag_llm.models.loader import load_model
from fusionrag_llm.models.tiny import TINY_FAMILIES

FAMILIES = list(TINY_FAMILIES)


def full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(len(ids))
    step = ForwardPass(token_ids=ids, positions=torch.arange(len(ids)), slots=cache.reserve(len(ids)))
    return model(step, cache).logits


def hf_twin(loaded) -> torch.nn.Module:
    config = AutoConfig.for_model(**loaded.hf_config)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(loaded.model.state_dict(), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return hf


def engine_greedy(loaded, ids: torch.Tensor, count: int) -> list[int]:
    model = loaded.model
    cache = model.new_cache(len(ids) + count)
    step = ForwardPass(ids, torch.arange(len(ids)), cache.reserve(len(ids)), logit_rows=torch.tensor([len(ids) - 1]))
    logits, tokens = model(step, cache).logits[0], []
    for position in range(len(ids), len(ids) + count):  # greedy decoding as a plain loop, no stop token
        tokens.append(int(torch.argmax(logits)))
        if len(tokens) < count:
            one = ForwardPass(torch.tensor(tokens[-1:]), torch.tensor([position]), cache.reserve(1))
            logits = model(one, cache).logits[0]
    return tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_logits_match_transformers(family):
    loaded = load_model(f"tiny-{family}")
    ids = torch.randint(0, 256, (97,), generator=torch.Generator().manual_seed(1))
    ours = full_logits(loaded.model, ids)
    with torch.no_grad():
        theirs = hf_twin(loaded)(ids[None]).logits[0]
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert ours.std() > 0.1  # random weights still give informative logits


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_greedy_generation_matches_transformers(family):
    loaded = load_model(f"tiny-{family}")
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = hf_twin(loaded).generate(ids[None], max_new_tokens=12, do_sample=False, eos_token_id=None,
                                          min_new_tokens=12, pad_token_id=0)[0, len(ids):].tolist()
    assert engine_greedy(loaded, ids, 12) == theirs


def test_model_folder_round_trip(tmp_path):
    """A folder saved by `transformers` loads through our loader with the same logits."""
    loaded = load_model("tiny-qwen3")
    hf = hf_twin(loaded)
    hf.save_pretrained(tmp_path)
    loaded.tokenizer.hf.save_pretrained(tmp_path)
    again = load_model(str(tmp_path))
    ids = torch.arange(10, 60)
    with torch.no_grad():
        theirs = hf(ids[None]).logits[0]
    assert (full_logits(again.model, ids) - theirs).abs().max().item() <= 1e-4
    assert again.model.cfg.qk_norm and again.model.cfg.tie_word_embeddings


@pytest.mark.parametrize("declared", [None, "GPT2TokenizerFast"])
def test_a_folders_tokenizer_is_the_one_auto_tokenizer_builds(tmp_path, declared):
    """The generic class a folder names is loaded directly (no config resolution); any other through
    AutoTokenizer: either way the class, the ids and the chat prompt AutoTokenizer gives."""
    from transformers import AutoTokenizer

    loaded = load_model("tiny-qwen3")
    hf_twin(loaded).save_pretrained(tmp_path)
    loaded.tokenizer.hf.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    if declared is not None:
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "tokenizer_class": declared}))
    again, auto = load_model(str(tmp_path)).tokenizer, AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(again.hf) is type(auto)
    assert (declared is None) == (type(auto).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend"))
    for text in ["Lanterns of Varn", " two  spaces\n\nand lines", "é <|im_end|>"]:
        assert again.hf.encode(text) == auto.encode(text)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which lantern?"}]
    assert again.render_chat(messages) == auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.real_model
def test_smollm2_logits_and_greedy_match_transformers(smollm2_rag):
    loaded = smollm2_rag.engine.loaded
    text = " ".join(f"Fact {i}: the {i}th lantern of Varn is painted {['red', 'blue', 'green'][i % 3]}." for i in range(16))
    prompt = loaded.tokenizer.render_chat([{"role": "user", "content": text + " Which colour is lantern 7?"}])
    ids = torch.tensor(loaded.tokenizer.encode_template(prompt))  # our own rendered chat: control tokens wanted
    assert 250 <= len(ids) <= 400
    hf = AutoModelForCausalLM.from_pretrained(loaded.source, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(ids[None]).logits[0]
        their_tokens = hf.generate(ids[None], max_new_tokens=16, do_sample=False, eos_token_id=None,
                                   min_new_tokens=16, pad_token_id=0)[0, len(ids):].tolist()
    assert (full_logits(loaded.model, ids) - theirs).abs().max().item() <= 1e-3
    assert engine_greedy(loaded, ids, 16) == their_tokens
