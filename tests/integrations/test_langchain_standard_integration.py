"""LangChain's standard integration tests for chat models, run against ChatFusionRAG on ``tiny``."""

import functools

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from fusionrag_llm import FusionRAG
from fusionrag_llm.integrations.langchain import ChatFusionRAG
from integration_helpers import TextOnlyCapabilities

# The suite's async tests carry no asyncio mark (LangChain's packages run pytest-asyncio in auto mode);
# marking the module runs them here in strict mode, and the sync tests ignore the mark.
pytestmark = [pytest.mark.asyncio, pytest.mark.filterwarnings("ignore:.*marked with '@pytest.mark.asyncio'")]


@functools.cache
def _engine() -> FusionRAG:
    return FusionRAG.from_pretrained("tiny", store=":memory:")


class TestChatFusionRAGIntegration(TextOnlyCapabilities, ChatModelIntegrationTests):
    @property
    def chat_model_class(self):
        return ChatFusionRAG

    @property
    def chat_model_params(self) -> dict:
        return {"rag": _engine(), "max_tokens": 8}
