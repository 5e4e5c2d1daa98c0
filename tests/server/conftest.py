"""The module's server: the tiny model with three registered chunks, behind a real loopback port."""

from types import SimpleNamespace

import pytest

from server_helpers import RunningServer, make_rag


@pytest.fixture(scope="module")
def served():
    from fusionrag_llm.server.app import create_app

    rag = make_rag()
    with RunningServer(create_app(rag, "tiny", max_waiting=64)) as base:
        yield SimpleNamespace(base=base, url=f"{base}/v1", rag=rag)
