"""Typed errors: every engine, controller or platform failure surfaces as one of these, never a hang.

Two roots, because a refusal and an outage call for opposite answers: a `ControllerError` is the
controller saying no (the trainer must change what it asks), a `PlatformError` is the platform
under it (the Kubernetes API, its transport) failing, which says nothing about the request:

    ControllerError
    ├── EngineError                     .endpoint
    │   ├── EngineTimeout
    │   ├── EngineUnavailable
    │   ├── EngineHTTPError             .status .body
    │   └── EngineProtocolError
    ├── LockHeld
    ├── SnapshotMismatch
    ├── WeightCheckMismatch             .mismatched
    ├── NoReadyEngines
    └── PinViolation
    PlatformError                       (never a ControllerError)
    └── EffectNotRecorded               .verb .cause

How each one is answered over the controller API (status, reason, the class a trainer
catches) is the error table in `controller_runtime.api.wire_errors`.
"""

from __future__ import annotations


class ControllerError(Exception):
    """Base of everything controller_runtime raises on purpose."""


class EngineError(ControllerError):
    """An engine call failed. `endpoint` says which engine."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"{endpoint}: {message}")
        self.endpoint = endpoint


class EngineTimeout(EngineError):
    """The engine did not answer within the call's timeout."""


class EngineUnavailable(EngineError):
    """The engine refused the connection or is gone."""


class EngineHTTPError(EngineError):
    """The engine answered with an HTTP error status."""

    def __init__(self, endpoint: str, status: int, body: str) -> None:
        super().__init__(endpoint, f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class EngineProtocolError(EngineError):
    """The engine answered something that is not what the route promises (garbage, wrong JSON)."""


class LockHeld(ControllerError):
    """The controller lock is held by an open weight-update window."""


class SnapshotMismatch(ControllerError):
    """A window call named a snapshot that is not the open window's."""


class WeightCheckMismatch(ControllerError):
    """Weight checksums after an update do not match what was expected."""

    def __init__(self, mismatched: dict[str, list[str]]) -> None:
        names = "; ".join(f"{cell}: {', '.join(t[:10])}" for cell, t in mismatched.items())
        super().__init__(f"weight check failed: {names}")
        self.mismatched = mismatched


class PinViolation(ControllerError):
    """An eval engine does not serve the pinned weight version."""


class NoReadyEngines(ControllerError):
    """start_update_weights found no cell whose engine can take weights."""


class PlatformError(Exception):
    """The platform the controller runs on failed: an API server's error answer, or no answer.

    Its own root so that no `except ControllerError` (and no row of the error table for one)
    ever takes an outage for a refusal."""


class EffectNotRecorded(PlatformError):
    """A controller call took effect but writing that effect into the job's record failed.

    Repeating the call is safe: the verbs that record their effect answer a repeat of their last
    call with the same answer, and the repeat records it (`cause`: the write's failure)."""

    def __init__(self, verb: str, cause: BaseException) -> None:
        super().__init__(f"{verb}: its effect could not be recorded: {type(cause).__name__}: {cause}")
        self.verb = verb
        self.cause = cause
