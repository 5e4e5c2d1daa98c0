"""Bad model names, paths, architectures and prompts fail with clear errors of the project's types."""

import json

import pytest

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.errors import ModelNotFoundError, PromptTooLongError, UnsupportedModelError
from fusionrag_llm.models.loader import load_model
from fusionrag_llm.models.tiny import tiny_hf_config


def write_config(folder, **overrides):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_hf_config("llama", **overrides)))
    return folder


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        load_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="tiny"):
        load_model("tiny-gpt2")


def test_missing_and_non_model_paths(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelNotFoundError, match="neither a model folder nor a .gguf"):
        load_model(str(tmp_path / "notes.txt"))
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "absent" / "model"))


@pytest.mark.parametrize(
    "overrides, feature",
    [
        ({"model_type": "gpt2"}, "architecture 'gpt2' is not supported"),
        ({"model_type": "deepseek_v3", "kv_lora_rank": 512}, "architecture 'deepseek_v3'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn'"),
        ({"model_type": "mistral", "sliding_window": 1024}, "sliding-window attention"),
        ({"kv_lora_rank": 512}, "multi-head latent attention"),
        ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ],
)
def test_unsupported_features_fail_at_load_naming_model_and_feature(tmp_path, overrides, feature):
    folder = write_config(tmp_path / "odd-model", **overrides)
    with pytest.raises(UnsupportedModelError) as caught:
        load_model(str(folder))
    assert feature in str(caught.value) and "odd-model" in str(caught.value)


def test_bad_device_and_dtype():
    with pytest.raises(FusionRAGError, match="dtype 'int8' is not supported"):
        load_model("tiny", dtype="int8")
    with pytest.raises(FusionRAGError, match="device"):
        load_model("tiny", device="tpu")


@pytest.mark.parametrize("card, capability, default", [("NVIDIA H100", (9, 0), "bfloat16"), ("NVIDIA A100", (8, 0), "bfloat16"),
                                                      ("Tesla T4", (7, 5), "float16"), ("Tesla V100", (7, 0), "float16")])  # fmt: skip
def test_a_gpu_without_bfloat16_defaults_to_float16_and_refuses_bfloat16(monkeypatch, card, capability, default):
    import torch

    from fusionrag_llm.models.loader import resolve_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    cuda = torch.device("cuda", 0)
    assert resolve_dtype(None, cuda) == getattr(torch, default)
    assert resolve_dtype("fp16", cuda) == torch.float16 and resolve_dtype(None, torch.device("cpu")) == torch.float32
    if default == "bfloat16":
        assert resolve_dtype("bf16", cuda) == torch.bfloat16
    else:
        with pytest.raises(FusionRAGError, match=rf"{card} \(compute capability {capability[0]}.{capability[1]}\) has "
                                                 "no bfloat16 arithmetic .*use dtype float16 or float32"):  # fmt: skip
            resolve_dtype(torch.bfloat16, cuda)


def test_prompt_longer_than_context_window(tiny_rag):
    long_chunk = "word " * (tiny_rag.context_window // 5 + 10)
    with pytest.raises(PromptTooLongError, match="context window of 4096"):
        tiny_rag.generate(RAGRequest(chunks=[long_chunk], question="why?"), method="full_attention")
    with pytest.raises(PromptTooLongError):
        tiny_rag.generate("x" * 4000, method="full_attention", max_new_tokens=200)


def test_empty_prompt_question_and_chunks(tiny_rag):
    with pytest.raises(FusionRAGError, match="prompt is empty"):
        tiny_rag.generate("   ")
    with pytest.raises(FusionRAGError, match="question must be a non-empty"):
        RAGRequest(chunks=["a"], question="")
    with pytest.raises(FusionRAGError, match=r"chunks\[1\] must be a non-empty"):
        RAGRequest(chunks=["a", ""], question="q")
    with pytest.raises(FusionRAGError, match="list of strings"):
        RAGRequest(chunks="just one string", question="q")


def test_unknown_method_lists_valid_ones(tiny_rag):
    with pytest.raises(ValueError, match="valid methods: full_attention"):
        tiny_rag.generate("hello", method="magic")


def test_bad_max_new_tokens(tiny_rag):
    with pytest.raises(FusionRAGError, match="max_new_tokens"):
        tiny_rag.generate("hello", max_new_tokens=0)


def test_from_pretrained_with_unknown_model_is_a_value_error():
    with pytest.raises(ValueError):
        FusionRAG.from_pretrained("definitely/not-a-local-model-xyz")
