"""A multi-turn conversation over retrieved chunks, with RAGBoost's de-duplication.

Each turn sends the whole chat so far plus a new user message holding the turn's retrieved chunks,
each on the line after its label ``[Doc_n]`` (numbered once per conversation, and on a line of its
own so the chunk's tokens stay its own and its entry serves it), and the question. A chunk that an earlier
turn already gave is not repeated: a short location hint points the model back to it (RAGBoost's
multi-turn de-duplication). With the engine's turn cache on (``turn_cache_gib``), every turn
reads the KV of the turns before it and computes only its own new tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.request import ChatRequest, PromptFormat, RAGRequest, check_tenant

LOCATION_HINT = "Please refer to {label} in the previous conversation."
SESSION_LABEL = "[Doc_{n}]"


class RAGSession:
    """Ask questions over chunks turn after turn; ``messages`` holds the chat so far.

    >>> from fusionrag_llm import FusionRAG
    >>> rag = FusionRAG.from_pretrained("tiny", options={"turn_cache_gib": 0.1})
    >>> session = RAGSession(rag)
    >>> _ = session.ask(["Paris is in France."], "Where is Paris?", max_new_tokens=2)
    >>> _ = session.ask(["Paris is in France.", "Lyon is too."], "And Lyon?", max_new_tokens=2)
    >>> session.messages[-2]["content"].count("Please refer to [Doc_1]"), session.deduplicated
    (1, 1)
    """

    def __init__(self, rag, system: str | None = None, dedupe: bool = True, format: PromptFormat = PromptFormat(),
                 tenant: str | None = None):  # fmt: skip
        if not isinstance(dedupe, bool):
            raise FusionRAGError(f"dedupe must be True or False, got {dedupe!r}")
        self.rag, self.dedupe, self.format = rag, dedupe, format
        self.tenant = check_tenant(tenant)  # every turn is answered for it (its chunks and turn KV only)
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self._labels: dict[str, int] = {}  # chunk text -> its document number in this conversation
        self.deduplicated = 0  # chunks replaced by a location hint so far

    def ask(self, chunks: Sequence[str], question: str, **options: Any):
        """Answer ``question`` over ``chunks`` after the turns before; ``options`` go to ``generate``."""
        RAGRequest(chunks=chunks, question=question)  # the same checks as a single request
        messages = [*self.messages, {"role": "user", "content": self._user_message(chunks, question)}]
        out = self.rag.generate(ChatRequest(messages, tenant=self.tenant) if self.tenant else messages, **options)
        self.messages = [*messages, {"role": "assistant", "content": out.text}]
        return out

    def _user_message(self, chunks: Sequence[str], question: str) -> str:
        fmt, parts = self.format, []
        for chunk in chunks:
            seen = chunk in self._labels
            number = self._labels.setdefault(chunk, len(self._labels) + 1)
            label = SESSION_LABEL.format(n=number)
            if seen and self.dedupe:
                parts.append(LOCATION_HINT.format(label=label))
                self.deduplicated += 1
            else:
                parts.append(f"{label}\n{chunk}")  # a line of its own: the chunk's first token stays its own
        return fmt.instruction + fmt.separator.join(parts) + fmt.question_prefix + question
