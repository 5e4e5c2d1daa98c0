"""A small tool-calling agent on the default model, through LangChain's ``bind_tools``: the model calls a
tool, the tool runs, its result goes back, and the model answers.

    python cookbook/tool_agent.py [--model smollm2-135m] [--question "What is 17 + 25?"]

The default 135M model does not decide well when to call a tool, so the loop is explicit: the first
step must call a tool (``tool_choice="required"``), the last one must answer in text
(``tool_choice="none"``). Every call is well-formed, because the answer is constrained to the tools'
JSON schemas.
"""

from __future__ import annotations

import argparse

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = {"add": add, "multiply": multiply}


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--question", default="What is 17 + 25? Use a tool.")
    args = parser.parse_args(argv)

    from fusionrag_llm import FusionRAG
    from fusionrag_llm.integrations.langchain import ChatFusionRAG

    chat = ChatFusionRAG(rag=FusionRAG.from_pretrained(args.model, store=":memory:"), max_tokens=96)
    messages, transcript = [HumanMessage(args.question)], [f"user: {args.question}"]
    step = chat.bind_tools(list(TOOLS.values()), tool_choice="required").invoke(messages)
    for call in step.tool_calls:
        result = TOOLS[call["name"]].invoke(call["args"])
        transcript += [f"call: {call['name']}({call['args']})", f"tool: {result}"]
        messages += [step, ToolMessage(content=str(result), tool_call_id=call["id"])]
    answer = chat.bind_tools(list(TOOLS.values()), tool_choice="none").invoke(messages)
    transcript.append(f"answer: {answer.content.strip()}")
    print("\n".join(transcript))
    return transcript


if __name__ == "__main__":
    main()
