"""Chat templates with a tool format of their own, in the shapes of well-known model families (for tests
with the ``tiny`` model's tokenizer, whose own template has no tools)."""

# Hermes / Qwen2.5 style: tools listed in a system turn, calls as <tool_call> JSON </tool_call>
HERMES = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{%- endif %}"
    "You may call one or more functions.\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Return each call as <tool_call>\n{\"name\": <name>, \"arguments\": <arguments>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}\n<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

# Llama 3.1 style: tools in the first user turn, a call as bare JSON with "parameters"
LLAMA_JSON = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for call in message.tool_calls %}"
    "{\"name\": \"{{ call.function.name }}\", \"parameters\": {{ call.function.arguments | tojson }}}"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>ipython\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'user' and loop.first and tools %}<|im_start|>user\n"
    "Functions you may call, as {\"name\": function name, \"parameters\": arguments}:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n\n{{ message.content }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def tiny_with_template(template: str):
    """A FusionRAG on the ``tiny`` model whose tokenizer (a copy) renders chats with ``template``."""
    import copy
    import dataclasses

    from fusionrag_llm import FusionRAG
    from fusionrag_llm.models.tokenizer import ChatTokenizer

    loaded = FusionRAG.from_pretrained("tiny", store=":memory:").engine.loaded
    hf = copy.deepcopy(loaded.tokenizer.hf)
    hf.chat_template = template
    return FusionRAG(dataclasses.replace(loaded, tokenizer=ChatTokenizer(hf)), store=":memory:")
