"""LangChain's own standard unit tests for chat models, run against ChatFusionRAG.

Tool calling and structured output are not offered (plain text generation only); the standard
suite skips those tests by itself when ``bind_tools``/``with_structured_output`` are not overridden.
"""

from langchain_tests.unit_tests import ChatModelUnitTests

from fusionrag_llm.integrations.langchain import ChatFusionRAG
from integration_helpers import TextOnlyCapabilities


class TestChatFusionRAGStandard(TextOnlyCapabilities, ChatModelUnitTests):
    @property
    def chat_model_class(self):
        return ChatFusionRAG

    @property
    def chat_model_params(self) -> dict:
        return {"model": "tiny"}  # loaded on first use; these unit tests never generate
