"""Adapters for LlamaIndex and LangChain; their imports are lazy so neither is needed to use the engine."""
