"""The frameworks' own OpenAI clients, unchanged, against the server: LangChain's ChatOpenAI and
LlamaIndex's OpenAILike give the library's answers, whole and streamed, sync and async."""

import asyncio

import pytest

from server_helpers import CHUNKS

QUESTION = f"Documents:\n{CHUNKS[0]}\n\n{CHUNKS[1]}\n\nQuestion: Who kept the log?"


def test_langchain_chat_openai_against_the_server(served):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, SystemMessage

    model = langchain_openai.ChatOpenAI(model="tiny", base_url=served.url, api_key="unused", max_tokens=8,
                                        temperature=0, max_retries=0)  # fmt: skip
    messages = [SystemMessage("Answer from the documents."), HumanMessage(QUESTION)]
    expected = served.rag.generate([{"role": "system", "content": "Answer from the documents."},
                                    {"role": "user", "content": QUESTION}], max_new_tokens=8)  # fmt: skip
    reply = model.invoke(messages)
    assert reply.content == expected.text
    assert reply.usage_metadata["input_tokens"] == len(expected.prompt_ids)
    assert "".join(chunk.content for chunk in model.stream(messages)) == expected.text
    assert asyncio.run(model.ainvoke(messages)).content == expected.text
    sampled = model.bind(temperature=1.1, seed=4)
    assert sampled.invoke(messages).content == sampled.invoke(messages).content


def test_llama_index_openai_like_against_the_server(served):
    openai_like = pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage

    llm = openai_like.OpenAILike(model="tiny", api_base=served.url, api_key="unused", is_chat_model=True,
                                 context_window=4096, max_tokens=8, temperature=0, max_retries=0)  # fmt: skip
    expected = served.rag.generate([{"role": "user", "content": QUESTION}], max_new_tokens=8)
    assert llm.chat([ChatMessage(role="user", content=QUESTION)]).message.content == expected.text
    assert llm.complete(QUESTION).text == expected.text
    streamed = "".join(part.delta for part in llm.stream_complete(QUESTION))
    assert streamed == expected.text
    assert asyncio.run(llm.acomplete(QUESTION)).text == expected.text
    completion = openai_like.OpenAILike(model="tiny", api_base=served.url, api_key="unused", is_chat_model=False,
                                        context_window=4096, max_tokens=6, temperature=0, max_retries=0)  # fmt: skip
    from fusionrag_llm import TextPrompt

    assert completion.complete("Q: Who kept the log? A:").text == served.rag.generate(
        TextPrompt("Q: Who kept the log? A:"), max_new_tokens=6).text
