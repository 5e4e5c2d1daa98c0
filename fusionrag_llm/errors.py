"""Errors raised for bad user input or unusable models.

All derive from ``ValueError`` so callers that already guard against bad arguments catch them.
"""


class FusionRAGError(ValueError):
    """Base class of the project's user-facing errors."""


class ModelNotFoundError(FusionRAGError):
    """A model name, path or hub id could not be resolved."""


class UnsupportedModelError(FusionRAGError):
    """The model exists but uses an architecture or feature the engine does not implement."""


class PromptTooLongError(FusionRAGError):
    """The prompt (plus the tokens to generate) does not fit the model's context window."""


class DefaultModelUnavailableError(FusionRAGError):
    """The embedded default model is not installed and could not be fetched."""
