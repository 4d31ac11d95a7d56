"""Why the engine did not serve a request, as exception types that know nothing of transports.

Each carries ``outcome``, the label it is counted under in the request metrics; the HTTP status
and the gRPC code a client sees are the servers' choice (:mod:`batcher.server`,
:mod:`batcher.grpc_server`), so the engine stays usable in-process and behind either face. The
same holds for the model repository's refusals (:class:`RepositoryError` and its kinds).
"""

from __future__ import annotations


class BatcherError(Exception):
    """A request was not served; ``outcome`` is the metric label it is counted under."""

    outcome = "model_error"


class InvalidRequest(BatcherError):
    """The request cannot be served as sent (its size, timeout or priority)."""

    outcome = "invalid"


class Rejected(BatcherError):
    """Refused at admission: the queue is full or the answer would come past its deadline.

    ``reason`` labels the rejection metric; ``retry_after`` (seconds) is when the work ahead
    should have drained enough to accept the same request (HTTP's ``Retry-After``).
    """

    outcome = "rejected"

    def __init__(self, message: str, reason: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class ShuttingDown(Rejected):
    """Refused because the runtime (or this model, being unloaded) is draining."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="shutting_down")


class RequestTimedOut(BatcherError):
    """The request did not start within its timeout."""

    outcome = "timeout"


class ModelFailed(BatcherError):
    """The model raised while running the request's batch."""

    outcome = "model_error"


class OutOfMemory(BatcherError):
    """The request does not fit in device memory, even alone."""

    outcome = "out_of_memory"


class DrainTimedOut(BatcherError):
    """The drain's time ran out before the request could run."""

    outcome = "shutdown"


class UnknownModel(BatcherError):
    """The request names a model this process does not serve (or no longer serves)."""

    outcome = "invalid"


class RepositoryError(Exception):
    """A model repository request (index, load, unload) that could not be done as asked."""


class NotInRepository(RepositoryError):
    """The repository holds no model of that name."""


class ModelConfigInvalid(RepositoryError):
    """The model's folder or its configuration is not usable; the message names the fix."""


class RepositoryBusy(RepositoryError):
    """The model is being loaded or unloaded by an earlier request."""


class LoadRefused(RepositoryError):
    """The model would not fit in the device memory left to the repository."""


class LoadFailed(RepositoryError):
    """Building or warming up the model failed (its factory raised)."""
