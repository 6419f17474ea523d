"""Exceptions raised by the provider. Messages name the bad value and say how to fix it.

Importable on the Ray cluster too: standard library only.
"""

from __future__ import annotations


class HorovodProviderError(Exception):
    """Base class of the provider's errors."""


class InvalidParameterError(HorovodProviderError, ValueError):
    """A parameter of an operator, sensor or trigger is invalid. Raised before anything is submitted."""

    def __init__(self, parameter: str, value: object, fix: str):
        self.parameter = parameter
        self.value = value
        self.fix = fix
        super().__init__(f"Invalid {parameter}={value!r}: {fix}")


class RayConnectionConfigError(HorovodProviderError, ValueError):
    """The Ray connection's fields or extras are malformed."""


class RayClusterUnreachableError(HorovodProviderError, ConnectionError):
    """The Ray dashboard did not answer after bounded retries."""


class RayAuthenticationError(HorovodProviderError, PermissionError):
    """The Ray dashboard refused the token (missing or wrong)."""


class RayVersionMismatchError(HorovodProviderError, RuntimeError):
    """The cluster runs another Ray version than this client."""


class RayJobError(HorovodProviderError, RuntimeError):
    """A Ray job ended FAILED or STOPPED, or could not be submitted."""

    def __init__(self, message: str, *, submission_id: str | None = None, status: str | None = None,
                 error_type: str | None = None):
        self.submission_id = submission_id
        self.status = status
        self.error_type = error_type
        super().__init__(message)


class RayJobPendingTimeoutError(RayJobError):
    """A Ray job stayed PENDING longer than allowed (resources no node has)."""


class UnknownJobStatusError(RayJobError):
    """Ray reported a job status the provider does not know (a Ray version it does not support)."""


class TrainingResultError(HorovodProviderError, RuntimeError):
    """The job succeeded but its result record or checkpoint is missing or unreadable."""


class MissingExtraError(HorovodProviderError, ImportError):
    """A feature needs an extra of the package (``[amazon]``, ``[cluster]``) that is not installed."""
