"""The trainer's handle on the InferenceController: over HTTP in a pod, in-process in local mode.

miles' trainer calls its InferenceController object directly; on Kubernetes the controller
lives in the operator, so the same calls go over the operator's controller API
(controller_runtime.api.control: paths and wire models shared with the server). Local mode
runs the controller in the trainer's own process and wraps it in `LocalControllerClient`,
so the trainer loop is one piece of code written against the `ControllerClient` Protocol.

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

from controller_runtime.api.control import (
    AbortUpdateRequest,
    AbortUpdateResponse,
    CellsResponse,
    EndUpdateRequest,
    EngineEndpoint,
    ErrorResponse,
    EvalFleetResponse,
    PrepareRolloutRequest,
    StartUpdateRequest,
    TagsRequest,
    UpdateWindowResponse,
    job_path,
)
from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import LockStatus
from controller_runtime.clock import Clock, RealClock
from controller_runtime.errors import (
    ControllerError,
    LockHeld,
    PinViolation,
    SnapshotMismatch,
    WeightCheckMismatch,
)
from controller_runtime.window import NoReadyEngines

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
WEIGHT_TAGS: tuple[MemoryTag, ...] = (MemoryTag.weights,)
KV_TAGS: tuple[MemoryTag, ...] = (MemoryTag.kv_cache, MemoryTag.cuda_graph)

M = TypeVar("M", bound=BaseModel)


# -- errors --------------------------------------------------------------------------------


class ControllerAPIError(ControllerError):
    """The controller API answered an error; `status` is the HTTP status, `reason` the server's word for it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"controller API {status} {reason}: {message}")
        self.status = status
        self.reason = reason


class ControllerUnauthorized(ControllerAPIError):
    """401/403: the token is missing, invalid, or lacks `update` on rljobs/control."""


class ControllerNotFound(ControllerAPIError):
    """404: no such RLJob (or no controller for it yet)."""


class ControllerUnavailable(ControllerAPIError):
    """503 past the retry deadline, or the operator could not be reached at all."""


class ControllerLockHeld(ControllerAPIError, LockHeld):
    """Another weight-update window is open."""


class ControllerSnapshotMismatch(ControllerAPIError, SnapshotMismatch):
    """end/abort named a snapshot that is not the open window's."""


class ControllerWeightCheckMismatch(ControllerAPIError, WeightCheckMismatch):
    """The weight check after an update failed."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        ControllerAPIError.__init__(self, status, reason, message)
        self.mismatched: dict[str, list[str]] = {}


class ControllerPinViolation(ControllerAPIError, PinViolation):
    """An eval engine does not serve the pinned version."""


class ControllerNoReadyEngines(ControllerAPIError, NoReadyEngines):
    """start_update_weights found no engine that can take weights (all starting or restarting)."""


_BY_REASON: dict[str, type[ControllerAPIError]] = {
    "LockHeld": ControllerLockHeld,
    "SnapshotMismatch": ControllerSnapshotMismatch,
    "WeightCheckMismatch": ControllerWeightCheckMismatch,
    "WeightCheckFailed": ControllerWeightCheckMismatch,
    "NoReadyEngines": ControllerNoReadyEngines,
    "PinViolation": ControllerPinViolation,
}
_BY_STATUS: dict[int, type[ControllerAPIError]] = {
    401: ControllerUnauthorized,
    403: ControllerUnauthorized,
    404: ControllerNotFound,
    409: ControllerLockHeld,
    503: ControllerUnavailable,
}


def api_error(status: int, body: str) -> ControllerAPIError:
    """The typed error for an error answer: by the server's `reason` first, then by status."""
    reason, message = f"HTTP{status}", body[:500]
    with contextlib.suppress(ValidationError, ValueError):
        err = ErrorResponse.model_validate_json(body)
        reason, message = err.reason, err.error
    cls = _BY_REASON.get(reason) or _BY_STATUS.get(status) or ControllerAPIError
    return cls(status, reason, message)


# -- the window ----------------------------------------------------------------------------


@dataclass
class WeightUpdateWindow:
    """An open window as the trainer sees it. Set `weight_version` inside the block to override the one given at open."""

    engines: list[EngineEndpoint]
    snapshot: dict[str, int]
    lock: LockStatus
    weight_version: str | None = None
    pushed: list[str] = field(default_factory=list)

    @classmethod
    def from_response(cls, resp: UpdateWindowResponse, weight_version: str | None) -> WeightUpdateWindow:
        return cls(engines=list(resp.engines), snapshot=dict(resp.snapshot), lock=resp.lock, weight_version=weight_version)


def window_response(window: Any) -> UpdateWindowResponse:
    """controller_runtime.window.UpdateWindow -> the wire model (the controller names a cell `name`, the wire `cell`)."""
    return UpdateWindowResponse(
        engines=[
            EngineEndpoint(cell=e.name, endpoint=e.endpoint, gpu_count=e.gpu_count, gpu_offset=e.gpu_offset,
                           generation=e.generation)
            for e in window.engines
        ],
        snapshot=dict(window.snapshot),
        lock=window.lock,
    )


class ControllerClient(Protocol):
    """What a trainer may ask of the InferenceController (miles' controller API)."""

    async def prepare_rollout(self, rollout_id: int) -> None: ...

    async def offload(self, tags: Sequence[MemoryTag] | None = None) -> None: ...

    async def onload(self, tags: Sequence[MemoryTag] | None = None) -> None: ...

    async def onload_weights(self) -> None: ...

    async def onload_kv(self) -> None: ...

    async def cells(self) -> CellsResponse: ...

    async def eval_fleet(self) -> EvalFleetResponse: ...

    async def start_update_weights(self, holder: str) -> UpdateWindowResponse: ...

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None) -> None: ...

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]: ...

    def update_weights(
        self, holder: str | None = None, weight_version: str | None = None
    ) -> contextlib.AbstractAsyncContextManager[WeightUpdateWindow]: ...

    async def close(self) -> None: ...


class _WindowMixin:
    """`update_weights()` and the onload shortcuts on top of the primitive calls."""

    holder: str

    async def start_update_weights(self, holder: str) -> UpdateWindowResponse:
        raise NotImplementedError

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None) -> None:
        raise NotImplementedError

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        raise NotImplementedError

    async def onload(self, tags: Sequence[MemoryTag] | None = None) -> None:
        raise NotImplementedError

    async def onload_weights(self) -> None:
        await self.onload(WEIGHT_TAGS)

    async def onload_kv(self) -> None:
        await self.onload(KV_TAGS)

    @contextlib.asynccontextmanager
    async def update_weights(
        self, holder: str | None = None, weight_version: str | None = None
    ) -> AsyncIterator[WeightUpdateWindow]:
        """Open a window; end it on a clean exit, abort it on any exception (then re-raise)."""
        resp = await self.start_update_weights(holder or self.holder)
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
        await self.end_update_weights(window.snapshot, window.weight_version)


# -- HTTP ----------------------------------------------------------------------------------


def default_holder() -> str:
    return os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or f"trainer-{os.getpid()}"


class InferenceControllerClient(_WindowMixin):
    """Async client of the operator's controller API for one RLJob.

    Authenticates with a bearer token: `token` if given, else the pod's ServiceAccount token
    file re-read on every call (kubelet rotates projected tokens). A 503 (standby operator
    replica, failover in progress) and a refused connection are retried, honouring
    Retry-After, until `retry_timeout` seconds have passed; every other failure raises a
    typed ControllerAPIError at once.
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
        self._token_file = Path(token_file) if token_file else None
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
        if token is None and self._token_file is not None and self._token_file.is_file():
            token = self._token_file.read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False)
            self._owns_session = True
        return self._session

    async def _call(self, method: str, verb: str, body: BaseModel | None, reply: type[M] | None) -> M | None:
        url = self.base_url + job_path(self.namespace, self.name, verb)
        payload = body.model_dump(by_alias=True, mode="json", exclude_none=True) if body is not None else None
        deadline = self._clock.now() + self._retry_timeout
        while True:
            try:
                async with self._client().request(
                    method, url, json=payload, headers=self._headers(),
                    timeout=aiohttp.ClientTimeout(total=self._timeout),
                ) as resp:
                    text = await resp.text()
                    if resp.status < 300:
                        if reply is None:
                            return None
                        try:
                            return reply.model_validate_json(text)
                        except ValidationError as exc:
                            raise ControllerAPIError(resp.status, "BadResponse", f"{verb}: {exc}") from exc
                    err = api_error(resp.status, text)
                    delay = retry_after(resp.headers.get("Retry-After"), text)
            except aiohttp.ClientConnectorError as exc:
                # Nothing reached the server: safe to retry any verb.
                err = ControllerUnavailable(0, "Unreachable", f"{url}: {exc}")
                delay = 1.0
            except TimeoutError as exc:
                raise ControllerUnavailable(0, "Timeout", f"{verb}: no answer within {self._timeout}s") from exc
            if not isinstance(err, ControllerUnavailable):
                raise err
            delay = min(max(delay, 0.05), self._max_retry_delay)
            if self._clock.now() + delay > deadline:
                raise err
            await self._clock.sleep(delay)

    async def prepare_rollout(self, rollout_id: int) -> None:
        await self._call("POST", "prepare_rollout", PrepareRolloutRequest(rollout_id=rollout_id), None)

    async def offload(self, tags: Sequence[MemoryTag] | None = None) -> None:
        await self._call("POST", "offload", _tags(tags), None)

    async def onload(self, tags: Sequence[MemoryTag] | None = None) -> None:
        await self._call("POST", "onload", _tags(tags), None)

    async def cells(self) -> CellsResponse:
        return await self._call("GET", "cells", None, CellsResponse)  # type: ignore[return-value]

    async def eval_fleet(self) -> EvalFleetResponse:
        return await self._call("POST", "eval_fleet", None, EvalFleetResponse)  # type: ignore[return-value]

    async def start_update_weights(self, holder: str) -> UpdateWindowResponse:
        return await self._call("POST", "start_update_weights", StartUpdateRequest(holder=holder), UpdateWindowResponse)  # type: ignore[return-value]

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None) -> None:
        await self._call("POST", "end_update_weights", EndUpdateRequest(snapshot=snapshot, weight_version=weight_version), None)

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        resp = await self._call("POST", "abort_update_weights", AbortUpdateRequest(snapshot=snapshot), AbortUpdateResponse)
        return list(resp.stopped) if resp is not None else []

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


class LocalControllerClient(_WindowMixin):
    """The same calls against an InferenceController in this process (local mode).

    Results go through the same wire models as over HTTP, so the trainer cannot come to rely
    on anything the HTTP API does not give it.
    """

    def __init__(self, controller: Any, holder: str = "local-trainer") -> None:
        self.controller = controller
        self.holder = holder

    async def prepare_rollout(self, rollout_id: int) -> None:
        await self.controller.prepare_rollout(rollout_id)

    async def offload(self, tags: Sequence[MemoryTag] | None = None) -> None:
        """Default tags: all of them, as the wire's TagsRequest defaults."""
        await self.controller.offload(_tags(tags).tags)

    async def onload(self, tags: Sequence[MemoryTag] | None = None) -> None:
        await self.controller.onload(_tags(tags).tags)

    async def cells(self) -> CellsResponse:
        return cells_response(self.controller)

    async def eval_fleet(self) -> EvalFleetResponse:
        fleet = getattr(self.controller, "eval_fleet", None)
        if fleet is None:
            return EvalFleetResponse(skip_reason="not_configured")
        result = await fleet()
        data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
        return EvalFleetResponse(
            endpoints=list(data.get("endpoints") or []),
            pinned_version=data.get("pinned_version"),
            checkpoint=data.get("checkpoint"),
            ok=bool(data.get("ok")),
            skip_reason=data.get("skip_reason"),
        )

    async def start_update_weights(self, holder: str) -> UpdateWindowResponse:
        return window_response(await self.controller.start_update_weights(holder))

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None) -> None:
        await self.controller.end_update_weights(snapshot, weight_version)

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        return list(await self.controller.abort_update_weights(snapshot))

    async def close(self) -> None:
        """The controller belongs to whoever made it; nothing to close here."""


def cells_response(controller: Any) -> CellsResponse:
    """The `cells` answer from a controller's read-only views (shared by local mode and test servers)."""
    patch = controller.status_patch()
    lock = patch.get("lock")
    return CellsResponse(
        engines=list(controller.engine_statuses()),
        weight_version=patch.get("weightVersion"),
        rollout_id=patch.get("rolloutId"),
        serving_endpoints=list(controller.serving_endpoints()),
        lock=LockStatus.model_validate(lock) if lock else None,
    )
