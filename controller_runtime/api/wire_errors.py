"""Every error answer of the controller API, in one table that servers and clients both read.

A server turns an exception into an answer with `answer_for` (status, reason, Retry-After);
a client turns an answer back into an exception with `error_from_answer`; the in-process
client does both at once with `client_error_for`. All three read `ERRORS`, so one reason can
never mean two things on two sides.

The classes are the exceptions a trainer sees. Where the controller has its own exception
the API class also derives from it, so `except LockHeld` or `except EngineError` catches the
same failure in-process and over HTTP. A failure of the platform under the controller (the
Kubernetes API) is never a refusal: it answers 5xx, and 503 NotRecorded (the call took effect,
writing it down failed; a repeat answers the same) is retried by the client:

    ControllerError                                  (controller_runtime.errors)
    └── ControllerAPIError                           status, reason, message, retry_after
        ├── ControllerBadRequest                     400 BadRequest
        ├── ControllerUnauthorized
        │   ├── ControllerUnauthenticated            401 Unauthenticated
        │   └── ControllerForbidden                  403 Forbidden
        ├── ControllerNotFound
        │   ├── ControllerJobNotFound                404 JobNotFound
        │   ├── ControllerNotWatched                 404 NotWatched
        │   └── ControllerUnknownVerb                404 UnknownVerb
        ├── ControllerMethodNotAllowed               405 MethodNotAllowed
        ├── ControllerLockHeld (LockHeld)            409 LockHeld
        ├── ControllerSnapshotMismatch (…)           409 SnapshotMismatch
        ├── ControllerWeightCheckMismatch (…)        409 WeightCheckFailed
        ├── ControllerNoReadyEngines (…)             409 NoReadyEngines
        ├── ControllerPinViolation (…)               409 PinViolation
        ├── ControllerJobSuspended                   409 Suspended
        ├── ControllerJobFinished                    409 Finished
        ├── ControllerConflict                       409 ControllerError (any other ControllerError)
        ├── ControllerInternalError                  500 InternalError
        ├── ControllerEngineError (EngineError)      502 EngineError
        │   └── ControllerEngineTimeout (…)          504 EngineTimeout
        └── ControllerUnavailable                    (status 0: Unreachable, Timeout)
            ├── ControllerNotLeader                  503 NotLeader, retried
            ├── ControllerReviewUnavailable          503 ReviewUnavailable, retried
            ├── ControllerStarting                   503 ControllerStarting, retried
            ├── ControllerNotRecorded                503 NotRecorded, retried (EffectNotRecorded)
            └── ControllerPlatformError              502 PlatformError (any other PlatformError)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from controller_runtime.api.control import ErrorResponse
from controller_runtime.errors import (
    ControllerError,
    EffectNotRecorded,
    EngineError,
    EngineTimeout,
    LockHeld,
    NoReadyEngines,
    PinViolation,
    PlatformError,
    SnapshotMismatch,
    WeightCheckMismatch,
)

# Reasons only a client makes up (status 0): nothing usable came back from a server.
UNREACHABLE = "Unreachable"
TIMEOUT = "Timeout"
BAD_RESPONSE = "BadResponse"


class ControllerAPIError(ControllerError):
    """The controller API refused a call; `status` is the HTTP status, `reason` the table's word for it."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        # Not super(): the controller's own bases (EngineError, WeightCheckMismatch) take other arguments.
        Exception.__init__(self, f"controller API {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class ControllerBadRequest(ControllerAPIError):
    """The body is not JSON, or does not match the verb's request model."""


class ControllerUnauthorized(ControllerAPIError):
    """401/403: the token is missing, invalid, or lacks `update` on rljobs/control."""


class ControllerUnauthenticated(ControllerUnauthorized):
    """401: no token, or TokenReview did not accept it."""


class ControllerForbidden(ControllerUnauthorized):
    """403: the caller may not `update` rljobs/control of this job."""


class ControllerNotFound(ControllerAPIError):
    """404: no such RLJob, namespace or verb here."""


class ControllerJobNotFound(ControllerNotFound):
    """There is no RLJob of that name."""


class ControllerNotWatched(ControllerNotFound):
    """This operator does not watch the job's namespace."""


class ControllerUnknownVerb(ControllerNotFound):
    """The path names no verb of the table."""


class ControllerMethodNotAllowed(ControllerAPIError):
    """The verb exists but takes another HTTP method."""


class ControllerLockHeld(ControllerAPIError, LockHeld):
    """Another weight-update window is open."""


class ControllerSnapshotMismatch(ControllerAPIError, SnapshotMismatch):
    """end/abort named a snapshot that is not the open window's (or the window expired)."""


class ControllerWeightCheckMismatch(ControllerAPIError, WeightCheckMismatch):
    """The weight check after an update failed; the window was aborted."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        ControllerAPIError.__init__(self, status, reason, message, retry_after)
        self.mismatched: dict[str, list[str]] = {}


class ControllerNoReadyEngines(ControllerAPIError, NoReadyEngines):
    """start_update_weights found no engine that can take weights (all starting or restarting)."""


class ControllerPinViolation(ControllerAPIError, PinViolation):
    """An eval engine does not serve the pinned version."""


class ControllerJobSuspended(ControllerAPIError):
    """The job is suspended (spec.suspend): its engines are stopped, nothing to retry until it resumes."""


class ControllerJobFinished(ControllerAPIError):
    """The job has succeeded or failed: its engines are stopped for good, a trainer should exit."""


class ControllerConflict(ControllerAPIError):
    """Any other refusal of the controller (a ControllerError without a row of its own)."""


class ControllerInternalError(ControllerAPIError):
    """The server failed in a way it did not foresee (a bug, or a bad argument it did not check)."""


class ControllerEngineError(ControllerAPIError, EngineError):
    """An engine call the controller made failed; the engine's address is in the message."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        ControllerAPIError.__init__(self, status, reason, message, retry_after)
        self.endpoint = ""  # not on the wire; the message names it


class ControllerEngineTimeout(ControllerEngineError, EngineTimeout):
    """An engine did not answer the controller in time."""


class ControllerUnavailable(ControllerAPIError):
    """The controller cannot answer now: a 503 past the retry deadline, or no server reached at all."""


class ControllerNotLeader(ControllerUnavailable):
    """A standby operator replica answered; the leader will (the client retries)."""


class ControllerReviewUnavailable(ControllerUnavailable):
    """The Kubernetes API could not review the caller's token (the client retries)."""


class ControllerStarting(ControllerUnavailable):
    """The job's controller is being started or restored on this replica (the client retries)."""


class ControllerNotRecorded(ControllerUnavailable):
    """The call took effect but the controller could not record it; the message names the cause.

    The client repeats the call: a repeat answers the same and records the effect."""


class ControllerPlatformError(ControllerUnavailable):
    """The platform under the controller (the Kubernetes API) failed during the call.

    Not retried by the client: the call may have taken part of its effect."""


@dataclass(frozen=True)
class ErrorRow:
    """One error answer. `raised_by`: the non-API exceptions a server answers with this row.

    `retryable`: the client repeats the call by itself (until its retry deadline), which is
    only safe when the server did nothing; `retry_after`: the hint sent as Retry-After.
    """

    reason: str
    status: int
    client: type[ControllerAPIError]
    raised_by: tuple[type[BaseException], ...] = ()
    retryable: bool = False
    retry_after: float | None = None


LOCK_RETRY_AFTER_S = 2.0
STANDBY_RETRY_AFTER_S = 2.0

ERRORS: tuple[ErrorRow, ...] = (
    ErrorRow("BadRequest", 400, ControllerBadRequest, (ValidationError,)),
    ErrorRow("Unauthenticated", 401, ControllerUnauthenticated),
    ErrorRow("Forbidden", 403, ControllerForbidden),
    ErrorRow("JobNotFound", 404, ControllerJobNotFound),
    ErrorRow("NotWatched", 404, ControllerNotWatched),
    ErrorRow("UnknownVerb", 404, ControllerUnknownVerb),
    ErrorRow("MethodNotAllowed", 405, ControllerMethodNotAllowed),
    ErrorRow("LockHeld", 409, ControllerLockHeld, (LockHeld,), retry_after=LOCK_RETRY_AFTER_S),
    ErrorRow("SnapshotMismatch", 409, ControllerSnapshotMismatch, (SnapshotMismatch,)),
    ErrorRow("WeightCheckFailed", 409, ControllerWeightCheckMismatch, (WeightCheckMismatch,)),
    ErrorRow("NoReadyEngines", 409, ControllerNoReadyEngines, (NoReadyEngines,)),
    ErrorRow("PinViolation", 409, ControllerPinViolation, (PinViolation,)),
    ErrorRow("Suspended", 409, ControllerJobSuspended),
    ErrorRow("Finished", 409, ControllerJobFinished),
    ErrorRow("ControllerError", 409, ControllerConflict, (ControllerError,)),
    ErrorRow("InternalError", 500, ControllerInternalError, (Exception,)),
    ErrorRow("EngineError", 502, ControllerEngineError, (EngineError,)),
    ErrorRow("EngineTimeout", 504, ControllerEngineTimeout, (EngineTimeout, TimeoutError)),
    ErrorRow("NotLeader", 503, ControllerNotLeader, retryable=True, retry_after=STANDBY_RETRY_AFTER_S),
    ErrorRow("ReviewUnavailable", 503, ControllerReviewUnavailable, retryable=True,
             retry_after=STANDBY_RETRY_AFTER_S),
    ErrorRow("ControllerStarting", 503, ControllerStarting, retryable=True, retry_after=1.0),
    ErrorRow("NotRecorded", 503, ControllerNotRecorded, (EffectNotRecorded,), retryable=True, retry_after=1.0),
    ErrorRow("PlatformError", 502, ControllerPlatformError, (PlatformError,)),
)

BY_REASON: dict[str, ErrorRow] = {row.reason: row for row in ERRORS}
BY_CLIENT: dict[type[ControllerAPIError], ErrorRow] = {row.client: row for row in ERRORS}
_BY_RAISED: dict[type[BaseException], ErrorRow] = {cls: row for row in ERRORS for cls in row.raised_by}
_INTERNAL = BY_REASON["InternalError"]

# An answer whose reason this client does not know (a newer server): the status's family.
_BY_STATUS: dict[int, type[ControllerAPIError]] = {
    401: ControllerUnauthorized,
    403: ControllerUnauthorized,
    404: ControllerNotFound,
    503: ControllerUnavailable,
}

E = TypeVar("E", bound=ControllerAPIError)


def refusal(cls: type[E], message: str, retry_after: float | None = None) -> E:
    """The exception a server raises to answer with `cls`'s row (status and reason from the table)."""
    row = BY_CLIENT[cls]
    return cls(row.status, row.reason, message, row.retry_after if retry_after is None else retry_after)


def row_for(exc: BaseException) -> ErrorRow:
    """The row a server answers `exc` with: an API error by its reason, anything else by its nearest class."""
    if isinstance(exc, ControllerAPIError):
        return BY_REASON.get(exc.reason, _INTERNAL)
    for cls in type(exc).__mro__:
        row = _BY_RAISED.get(cls)
        if row is not None:
            return row
    return _INTERNAL


@dataclass(frozen=True)
class ErrorAnswer:
    """What goes on the wire for one failure: status, JSON body and headers."""

    status: int
    body: ErrorResponse
    headers: dict[str, str]


def answer_for(exc: BaseException) -> ErrorAnswer:
    row = row_for(exc)
    if isinstance(exc, ControllerAPIError) and exc.reason == row.reason:
        message, retry_after = exc.message, exc.retry_after
    elif row is _INTERNAL:
        message, retry_after = f"{type(exc).__name__}: {exc}", row.retry_after
    else:
        message, retry_after = str(exc), row.retry_after
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else {}
    body = ErrorResponse(error=message, reason=row.reason, retry_after_seconds=retry_after)
    return ErrorAnswer(row.status, body, headers)


def error_from_answer(status: int, body: str, retry_after_header: str | None = None) -> ControllerAPIError:
    """The client's exception for an error answer: by the reason's row, else by the status's family."""
    reason, message, hint = f"HTTP{status}", body[:500], None
    with contextlib.suppress(ValidationError, ValueError):
        err = ErrorResponse.model_validate_json(body)
        reason, message, hint = err.reason, err.error, err.retry_after_seconds
    if retry_after_header:
        with contextlib.suppress(ValueError):
            hint = float(retry_after_header)
    row = BY_REASON.get(reason)
    cls = row.client if row is not None else _BY_STATUS.get(status, ControllerAPIError)
    return cls(status, reason, message, hint)


def client_error_for(exc: BaseException) -> ControllerAPIError:
    """What a client over HTTP would raise for `exc`, built in-process (LocalControllerClient)."""
    answer = answer_for(exc)
    err = error_from_answer(answer.status, answer.body.model_dump_json(by_alias=True),
                            answer.headers.get("Retry-After"))
    if isinstance(err, ControllerWeightCheckMismatch) and isinstance(exc, WeightCheckMismatch):
        err.mismatched = dict(exc.mismatched)
    if isinstance(err, ControllerEngineError) and isinstance(exc, EngineError):
        err.endpoint = exc.endpoint
    return err


def is_retryable(err: ControllerAPIError) -> bool:
    """Whether a client may repeat the call by itself: the server did nothing, and may answer later."""
    row = BY_REASON.get(err.reason)
    if row is not None:
        return row.retryable
    return err.reason == UNREACHABLE or err.status == 503
