"""Shared fixtures. Kernel tests run the Triton code under the interpreter when there is no GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def isolated_default_store(tmp_path_factory):
    """The default KV store of every FusionRAG in the tests is a fresh folder, not the user's cache."""
    os.environ["FUSIONRAG_STORE"] = str(tmp_path_factory.mktemp("default-store"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_rag():
    from fusionrag_llm import FusionRAG

    return FusionRAG.from_pretrained("tiny", store=":memory:")


@pytest.fixture(scope="session")
def smollm2_rag():
    from fusionrag_llm import FusionRAG

    return FusionRAG.from_pretrained("smollm2-135m")


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster of 2 CPUs for the tests of ingestion with workers, started once."""
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()
