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


class MissingDependencyError(FusionRAGError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it.

    Also an ``ImportError``, so code that probes for optional packages keeps working.
    """


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency on first use, or say which extra installs it.

    >>> require("json", "embed", "reading JSON").__name__
    'json'
    >>> require("no_such_module_xyz", "embed", "the neighbour search")
    Traceback (most recent call last):
    ...
    fusionrag_llm.errors.MissingDependencyError: the neighbour search needs 'no_such_module_xyz', which is not installed; install it with: pip install "fusionrag_llm[embed]"
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and module != exc.name and not module.startswith(exc.name + "."):
            raise  # the package is there but one of its own imports failed: show that, not a hint
        raise MissingDependencyError(
            f"{purpose} needs {module.split('.')[0]!r}, which is not installed; "
            f'install it with: pip install "fusionrag_llm[{extra}]"'
        ) from None
