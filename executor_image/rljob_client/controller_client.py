"""The trainer's handle on the InferenceController: over HTTP in a pod, in-process in local mode.

miles' trainer calls its InferenceController object directly; on Kubernetes the controller
lives in the operator, so the same calls go over the operator's controller API. Local mode
runs the controller in the trainer's own process and wraps it in `LocalControllerClient`,
so the trainer loop is one piece of code written against the `ControllerClient` Protocol.
Both clients go through the servers' tables (`controller_runtime.api.verbs` for the verbs,
`controller_runtime.api.wire_errors` for the exceptions), so they answer and fail alike.

The update window is a context manager because its two exits are not symmetrical: a clean
exit must `end` the window with the new version (cells join serving), any exception must
`abort` it (participant cells may hold half-written weights and are stopped) and the
exception must still reach the caller. Forgetting either leaves the controller locked until
the lock expires.

    async with client.update_weights(holder="trainer-0", weight_version="7") as window:
        for engine in window.engines:
            ...push weights to engine.endpoint...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from controller_runtime.api.base import ApiModel
from controller_runtime.api.control import (
    EVAL_PIN_WAIT_SECONDS,
    PREPARE_WAIT_SECONDS,
    AbortUpdateRequest,
    AbortUpdateResponse,
    CellsResponse,
    EndUpdateRequest,
    EngineEndpoint,
    ErrorResponse,
    EvalFleetRequest,
    EvalFleetResponse,
    MemoryChangeResponse,
    PrepareRolloutRequest,
    RecordEvalRequest,
    StartUpdateRequest,
    TagsRequest,
    UpdateWindowResponse,
    job_path,
)
from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import EvalStatus, LockStatus
from controller_runtime.api.verbs import VERBS, cells_response, eval_response, window_response
from controller_runtime.api.wire_errors import (
    BAD_RESPONSE,
    TIMEOUT,
    UNREACHABLE,
    ControllerAPIError,
    ControllerBadRequest,
    ControllerConflict,
    ControllerEngineError,
    ControllerEngineTimeout,
    ControllerForbidden,
    ControllerInternalError,
    ControllerJobFinished,
    ControllerJobNotFound,
    ControllerJobSuspended,
    ControllerLockHeld,
    ControllerMethodNotAllowed,
    ControllerNoReadyEngines,
    ControllerNotFound,
    ControllerNotLeader,
    ControllerNotRecorded,
    ControllerNotWatched,
    ControllerPinViolation,
    ControllerPlatformError,
    ControllerReviewUnavailable,
    ControllerSnapshotMismatch,
    ControllerStarting,
    ControllerUnauthenticated,
    ControllerUnauthorized,
    ControllerUnavailable,
    ControllerUnknownVerb,
    ControllerWeightCheckMismatch,
    client_error_for,
    error_from_answer,
    is_retryable,
)
from controller_runtime.clock import Clock, RealClock
from controller_runtime.errors import ControllerError
from rljob_client.errors import RLJobError
from rljob_client.token_file import TokenFile

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
WEIGHT_TAGS: tuple[MemoryTag, ...] = (MemoryTag.weights,)
KV_TAGS: tuple[MemoryTag, ...] = (MemoryTag.kv_cache, MemoryTag.cuda_graph)

M = TypeVar("M", bound=BaseModel)

# The error classes live with the error table (controller_runtime.api.wire_errors); these
# names are what trainers have always imported from here.
__all__ = [
    "KV_TAGS", "SERVICE_ACCOUNT_TOKEN", "WEIGHT_TAGS", "WINDOW_HOLDER_ENV",
    "ControllerAPIError", "ControllerBadRequest", "ControllerClient", "ControllerConflict", "ControllerEngineError",
    "ControllerEngineTimeout", "ControllerForbidden", "ControllerInternalError", "ControllerJobFinished",
    "ControllerJobNotFound", "ControllerJobSuspended", "ControllerLockHeld", "ControllerMethodNotAllowed",
    "ControllerNoReadyEngines", "ControllerNotFound", "ControllerNotLeader", "ControllerNotRecorded",
    "ControllerNotWatched", "ControllerPinViolation", "ControllerPlatformError", "ControllerReviewUnavailable", "ControllerSnapshotMismatch", "ControllerStarting",
    "ControllerUnauthenticated", "ControllerUnauthorized", "ControllerUnavailable", "ControllerUnknownVerb",
    "ControllerWeightCheckMismatch", "InferenceControllerClient", "LocalControllerClient", "MemoryChangeFailed",
    "WeightUpdateWindow", "api_error", "cells_response", "default_holder", "eval_response", "retry_after",
    "window_response",
]


def api_error(status: int, body: str) -> ControllerAPIError:
    """The typed error for an error answer (the error table's row for its reason)."""
    return error_from_answer(status, body)


class MemoryChangeFailed(RLJobError, ControllerError):
    """offload/onload answered, but some engines refused: `change.failed` says which and why.

    Raised rather than returned quietly because the caller's next step depends on the memory
    having moved: a colocated trainer allocates the GPU memory an engine was asked to
    release. The answer rides along (`change`), so a caller that can live with it catches
    this and goes on with `change.changed`.
    """

    def __init__(self, verb: str, change: MemoryChangeResponse) -> None:
        failed = "; ".join(f"{cell}: {why}" for cell, why in sorted(change.failed.items()))
        super().__init__(f"{verb} failed on {len(change.failed)} cell(s): {failed}")
        self.verb = verb
        self.change = change


def _checked(verb: str, change: MemoryChangeResponse) -> MemoryChangeResponse:
    if change.failed:
        raise MemoryChangeFailed(verb, change)
    return change


# -- the window ----------------------------------------------------------------------------


@dataclass
class WeightUpdateWindow:
    """An open window as the trainer sees it. Set `weight_version` inside the block to override the one given at open."""

    engines: list[EngineEndpoint]
    snapshot: dict[str, int]
    lock: LockStatus
    weight_version: str | None = None
    pushed: list[str] = field(default_factory=list)
    expected_checksums: dict[str, str] | None = None  # set by a transport that can be checked by tensor

    @classmethod
    def from_response(cls, resp: UpdateWindowResponse, weight_version: str | None) -> WeightUpdateWindow:
        return cls(engines=list(resp.engines), snapshot=dict(resp.snapshot), lock=resp.lock, weight_version=weight_version)


class ControllerClient(Protocol):
    """What a trainer may ask of the InferenceController (miles' controller API)."""

    async def prepare_rollout(self, rollout_id: int, wait_seconds: float | None = None) -> None: ...

    async def offload(self, tags: Sequence[MemoryTag] | None = None) -> MemoryChangeResponse: ...

    async def onload(self, tags: Sequence[MemoryTag] | None = None) -> MemoryChangeResponse: ...

    async def onload_weights(self) -> MemoryChangeResponse: ...

    async def onload_kv(self) -> MemoryChangeResponse: ...

    async def cells(self) -> CellsResponse: ...

    async def eval_fleet(self, checkpoint: str | None = None, weight_version: str | None = None) -> EvalFleetResponse: ...

    async def record_eval(self, point: RecordEvalRequest) -> EvalStatus: ...

    async def start_update_weights(self, holder: str, ready_timeout: float | None = None) -> UpdateWindowResponse: ...

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None,
                                 expected_checksums: dict[str, str] | None = None) -> None: ...

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]: ...

    def update_weights(
        self, holder: str | None = None, weight_version: str | None = None, ready_timeout: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[WeightUpdateWindow]: ...

    async def close(self) -> None: ...


class _VerbClient:
    """Every verb of `controller_runtime.api.verbs.VERBS` on top of one transport call, `_call`.

    The two clients differ only in `_call` (over HTTP, or straight into a controller in this
    process); both answer with the verb's response model and raise the error table's classes,
    so a trainer cannot come to rely on anything one transport gives and the other does not.
    """

    holder: str

    async def _call(self, verb: str, request: ApiModel | None, waits: float = 0.0) -> ApiModel:
        """`waits`: seconds the controller may legitimately take on top of a normal answer
        (a prepare that waits for a window, a window that waits for starting cells)."""
        raise NotImplementedError

    async def _answer(self, verb: str, request: ApiModel | None, reply: type[M], waits: float = 0.0) -> M:
        out = await self._call(verb, request, waits)
        if not isinstance(out, reply):
            raise ControllerAPIError(0, BAD_RESPONSE, f"{verb}: answered {type(out).__name__}, not {reply.__name__}")
        return out

    async def prepare_rollout(self, rollout_id: int, wait_seconds: float | None = None) -> None:
        """During an open window the controller waits for it to close (`wait_seconds`, default
        the controller's), then answers LockHeld naming the holder."""
        await self._call("prepare_rollout", PrepareRolloutRequest(rollout_id=rollout_id, wait_seconds=wait_seconds),
                         waits=PREPARE_WAIT_SECONDS if wait_seconds is None else wait_seconds)

    async def offload(self, tags: Sequence[MemoryTag] | None = None) -> MemoryChangeResponse:
        """Default tags: all of them, as the wire's TagsRequest defaults. Raises MemoryChangeFailed if an engine refused."""
        return _checked("offload", await self._answer("offload", _tags(tags), MemoryChangeResponse))

    async def onload(self, tags: Sequence[MemoryTag] | None = None) -> MemoryChangeResponse:
        """Raises MemoryChangeFailed if an engine refused (that cell stays offloaded)."""
        return _checked("onload", await self._answer("onload", _tags(tags), MemoryChangeResponse))

    async def onload_weights(self) -> MemoryChangeResponse:
        return await self.onload(WEIGHT_TAGS)

    async def onload_kv(self) -> MemoryChangeResponse:
        return await self.onload(KV_TAGS)

    async def cells(self) -> CellsResponse:
        return await self._answer("cells", None, CellsResponse)

    async def eval_fleet(self, checkpoint: str | None = None, weight_version: str | None = None) -> EvalFleetResponse:
        """Pinned to `checkpoint` as `weight_version` when given (an eval point), else to the spec's."""
        if checkpoint is None and weight_version is None:
            return await self._answer("eval_fleet", None, EvalFleetResponse)
        request = EvalFleetRequest(checkpoint=checkpoint, weight_version=weight_version)
        return await self._answer("eval_fleet", request, EvalFleetResponse, waits=EVAL_PIN_WAIT_SECONDS)

    async def record_eval(self, point: RecordEvalRequest) -> EvalStatus:
        """status.lastEval; the controller stamps the time."""
        return await self._answer("record_eval", point, EvalStatus)

    async def start_update_weights(self, holder: str, ready_timeout: float | None = None) -> UpdateWindowResponse:
        """With `ready_timeout`, the controller first waits up to that long for cells that are starting."""
        request = StartUpdateRequest(holder=holder, ready_timeout_seconds=ready_timeout)
        return await self._answer("start_update_weights", request, UpdateWindowResponse, waits=ready_timeout or 0.0)

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None,
                                 expected_checksums: dict[str, str] | None = None) -> None:
        await self._call("end_update_weights", EndUpdateRequest(snapshot=snapshot, weight_version=weight_version,
                                                                expected_checksums=expected_checksums))

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        resp = await self._answer("abort_update_weights", AbortUpdateRequest(snapshot=snapshot), AbortUpdateResponse)
        return list(resp.stopped)

    @contextlib.asynccontextmanager
    async def update_weights(
        self, holder: str | None = None, weight_version: str | None = None, ready_timeout: float | None = None
    ) -> AsyncIterator[WeightUpdateWindow]:
        """Open a window; end it on a clean exit, abort it on any exception (then re-raise)."""
        resp = await (self.start_update_weights(holder or self.holder) if ready_timeout is None
                      else self.start_update_weights(holder or self.holder, ready_timeout))
        window = WeightUpdateWindow.from_response(resp, weight_version)
        try:
            yield window
        except BaseException as exc:
            # Abort must run even when the body was cancelled; shield it so the lock is released.
            try:
                stopped = await asyncio.shield(self.abort_update_weights(window.snapshot))
                log.warning("update window aborted (%s: %s); cells stopped: %s", type(exc).__name__, exc, stopped)
            except Exception as abort_exc:  # the lock then expires on the controller's side
                log.error("aborting the update window failed: %s (the lock expires at %s)", abort_exc,
                          window.lock.expires)
            raise
        if window.expected_checksums is None:
            await self.end_update_weights(window.snapshot, window.weight_version)
        else:
            await self.end_update_weights(window.snapshot, window.weight_version,
                                          expected_checksums=window.expected_checksums)


# -- HTTP ----------------------------------------------------------------------------------


WINDOW_HOLDER_ENV = "RLJOB_WINDOW_HOLDER"


def default_holder() -> str:
    """Who this trainer is to the controller's lock: `RLJOB_WINDOW_HOLDER` when set, else the pod.

    A trainer killed inside a window leaves the lock held; its next start recognises the window
    as its own by this name and aborts it at once (`resume.abort_orphan_window`). The operator
    sets it to the trainer Job's name because the pod name (and HOSTNAME) is new on every
    restart: named by pod, the restarted trainer met LockHeld until the lock expired
    (`lockTimeoutSeconds`, 600 s by default) and failed each attempt meanwhile. Set it the
    same way in a trainer of your own (`workloadRef`)."""
    return (os.environ.get(WINDOW_HOLDER_ENV) or os.environ.get("POD_NAME") or os.environ.get("HOSTNAME")
            or f"trainer-{os.getpid()}")


class InferenceControllerClient(_VerbClient):
    """Async client of the operator's controller API for one RLJob.

    Authenticates with a bearer token: `token` if given, else the pod's ServiceAccount token
    file (`token_file.TokenFile`: read again when the kubelet rotated it, when the token is past
    its expiry, and once when the controller answers 401, after which the call is made again
    if the file held a newer token). The error table's retryable answers (503: a standby
    operator replica, a failover in progress, an effect the controller could not record yet)
    and a refused connection are retried, honouring Retry-After, until `retry_timeout`
    seconds have passed; every other failure raises a typed ControllerAPIError at once.
    """

    def __init__(
        self,
        base_url: str,
        name: str,
        namespace: str = "default",
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = SERVICE_ACCOUNT_TOKEN,
        holder: str | None = None,
        timeout: float = 60.0,
        retry_timeout: float = 120.0,
        max_retry_delay: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.namespace = namespace
        self.holder = holder or default_holder()
        self._token = token
        self._token_file = TokenFile(token_file) if token_file else None
        self._timeout = timeout
        self._retry_timeout = retry_timeout
        self._max_retry_delay = max_retry_delay
        self._session = session
        self._owns_session = session is None
        self._clock: Clock = clock or RealClock()

    @classmethod
    def from_env(cls, **kwargs: Any) -> InferenceControllerClient:
        """RLJOB_CONTROLLER_URL, RLJOB_NAME, RLJOB_NAMESPACE as the operator injects them into trainer pods.

        RLJOB_CONTROLLER_TOKEN_FILE, when set, replaces the ServiceAccount token file.
        """
        try:
            url, name = os.environ["RLJOB_CONTROLLER_URL"], os.environ["RLJOB_NAME"]
        except KeyError as exc:
            raise ControllerError(f"environment variable {exc.args[0]} is not set (the operator injects it into trainer pods)") from None
        if os.environ.get("RLJOB_CONTROLLER_TOKEN_FILE") and "token" not in kwargs:
            kwargs.setdefault("token_file", os.environ["RLJOB_CONTROLLER_TOKEN_FILE"])
        return cls(url, name, os.environ.get("RLJOB_NAMESPACE", "default"), **kwargs)

    def _headers(self) -> dict[str, str]:
        token = self._token
        if token is None and self._token_file is not None:
            token = self._token_file.current()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _token_renewed(self, err: ControllerAPIError) -> bool:
        """After a 401: whether the token file now holds another token (then the call is worth
        repeating: the kubelet rotated it between our read and the controller's review)."""
        return isinstance(err, ControllerUnauthenticated) and self._token is None and self._token_file is not None \
            and self._token_file.refresh()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False)
            self._owns_session = True
        return self._session

    async def _call(self, verb: str, request: ApiModel | None, waits: float = 0.0) -> ApiModel:
        spec = VERBS[verb]
        url = self.base_url + job_path(self.namespace, self.name, verb)
        payload = request.model_dump(by_alias=True, mode="json", exclude_none=True) if request is not None else None
        deadline = self._clock.now() + self._retry_timeout
        renewed = False  # one repeat after a 401 with a rotated token, never a loop
        while True:
            try:
                async with self._client().request(
                    spec.method, url, json=payload, headers=self._headers(),
                    timeout=aiohttp.ClientTimeout(total=self._timeout + waits),
                ) as resp:
                    text = await resp.text()
                    if resp.status < 300:
                        try:
                            return spec.response.model_validate_json(text)
                        except ValidationError as exc:
                            raise ControllerAPIError(resp.status, BAD_RESPONSE, f"{verb}: {exc}") from exc
                    err = error_from_answer(resp.status, text, resp.headers.get("Retry-After"))
                    delay = retry_after(resp.headers.get("Retry-After"), text)
            except aiohttp.ClientConnectorError as exc:
                # Nothing reached the server: safe to retry any verb.
                err = ControllerUnavailable(0, UNREACHABLE, f"{url}: {exc}")
                delay = 1.0
            except TimeoutError as exc:
                raise ControllerUnavailable(0, TIMEOUT, f"{verb}: no answer within {self._timeout + waits:g}s") from exc
            if not renewed and self._token_renewed(err):
                renewed = True
                continue
            if not is_retryable(err):
                raise err
            delay = min(max(delay, 0.05), self._max_retry_delay)
            if self._clock.now() + delay > deadline:
                raise err
            await self._clock.sleep(delay)

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None


def _tags(tags: Sequence[MemoryTag] | None) -> TagsRequest:
    return TagsRequest() if tags is None else TagsRequest(tags=list(tags))


def retry_after(header: str | None, body: str) -> float:
    """Seconds to wait before retrying: Retry-After (seconds form), else the body's hint, else 1."""
    if header:
        with contextlib.suppress(ValueError):
            return float(header)
    with contextlib.suppress(ValidationError, ValueError):
        hint = ErrorResponse.model_validate_json(body).retry_after_seconds
        if hint is not None:
            return hint
    return 1.0


# -- in-process ------------------------------------------------------------------------------


class LocalControllerClient(_VerbClient):
    """The same calls against an InferenceController in this process (local mode).

    Each call goes through the verb table's controller call, and each failure through the
    error table (as if it had crossed the wire), so the trainer sees the same answers and
    the same exception classes as over HTTP.
    """

    def __init__(self, controller: Any, holder: str = "local-trainer") -> None:
        self.controller = controller
        self.holder = holder

    async def _call(self, verb: str, request: ApiModel | None, waits: float = 0.0) -> ApiModel:
        try:
            return await VERBS[verb].call(self.controller, request)
        except Exception as exc:
            raise client_error_for(exc) from exc

    async def close(self) -> None:
        """The controller belongs to whoever made it; nothing to close here."""
