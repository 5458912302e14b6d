"""The client's errors: one message each, naming the logical model, its ``TargetModel`` and
SageMaker's request id where there is one, so a caller can act on it without a stack trace."""

from __future__ import annotations


class TritonMmeError(Exception):
    """Base class of every error this package raises on purpose."""

    def __init__(self, message: str, *, model: str | None = None, target_model: str | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(message)
        #: The logical name asked for (``minilm-l6-text``), if the error concerns one.
        self.model = model
        #: The content-named ``TargetModel`` it resolved to, if it got that far.
        self.target_model = target_model
        #: SageMaker's ``x-amzn-RequestId`` of the failed call, if a call was made.
        self.request_id = request_id


class ConfigurationError(TritonMmeError, ValueError):
    """A constructor argument or environment variable that cannot work (named, with its value)."""


class RoutesError(TritonMmeError):
    """The routes document is missing, unreadable, truncated, of another schema or malformed, or a
    route names an object that is not the content name of its own digest (never called)."""


class ModelNotFound(TritonMmeError, LookupError):
    """A logical name that the routes document does not route, after one refresh."""


class InvalidInput(TritonMmeError, ValueError):
    """Inputs that the model's published signature refuses (a name, datatype, rank or shape), found
    before any call; nothing was sent."""


class EndpointError(TritonMmeError):
    """The endpoint answered with an error, or kept failing after the bounded retries.

    ``status`` is the HTTP status of the last answer (None: no answer, a connection error),
    ``code`` the error code (``ModelError``, ``ThrottlingException``...), ``original_status`` the
    model container's own status where SageMaker relays one (507: out of memory), ``attempts``
    how many calls were made."""

    def __init__(self, message: str, *, model: str | None = None, target_model: str | None = None,
                 request_id: str | None = None, status: int | None = None, code: str = "",
                 original_status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message, model=model, target_model=target_model, request_id=request_id)
        self.status = status
        self.code = code
        self.original_status = original_status
        self.attempts = attempts


class ModelError(EndpointError):
    """The model itself refused the request (a 4xx from Triton, such as a shape it cannot take):
    not retried, since the same request would fail the same way."""
