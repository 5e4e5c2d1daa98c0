"""``reproducible`` in a request body, with the real OpenAI client: the answer does not read the exact
KV a Full Attention request left."""

import pytest
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST
from server_helpers import RunningServer

from fusionrag_llm import FusionRAG
from fusionrag_llm.server.app import create_app

openai = pytest.importorskip("openai")
PROMPT = [{"role": "user", "content": "\n\n".join([*REQUEST.chunks, REQUEST.question])}]


def test_the_server_takes_reproducible_in_the_body():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    with RunningServer(create_app(rag, "tiny")) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

        def exact(**extra) -> int:
            reply = client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=2, extra_body=extra)
            return reply.model_extra["fusionrag"]["stats"][0]["path_hits"]["exact"]

        cold = exact()
        exact(method="full_attention")
        assert exact() > cold and exact(reproducible=True) == cold
