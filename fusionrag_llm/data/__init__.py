"""Small data bundled with the package (the demo corpus)."""

import json
from importlib import resources


def demo_corpus() -> dict:
    """The bundled demo corpus: ``{"passages": [...], "questions": [{"question", "answer", "passages"}]}``."""
    return json.loads(resources.files(__name__).joinpath("demo_corpus.json").read_text())
