"""The controller API's verbs as one table: both servers dispatch through it, both clients call through it.

Before this table the verbs were written four times (the operator's server, local mode's
server, the in-process client, a test server) and the copies drifted: local mode answered
offload with the cells only, threw the eval fleet's message away, and so on. A verb here is
its path segment, HTTP method(s), request and response models, and the one function that
turns a request into a controller call and the controller's answer into the response.

A server adds only what is its own: authentication, which job, and (the operator) writing
`status` before it answers, for the verbs with `writes_status`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller_runtime.api.base import ApiModel
from controller_runtime.api.control import (
    AbortUpdateRequest,
    AbortUpdateResponse,
    CellsResponse,
    EndUpdateRequest,
    EngineEndpoint,
    EvalFleetRequest,
    EvalFleetResponse,
    MemoryChangeResponse,
    PrepareRolloutRequest,
    RecordEvalRequest,
    StartUpdateRequest,
    TagsRequest,
    UpdateWindowResponse,
)
from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import EngineStatus, EvalStatus
from controller_runtime.api.wire_errors import (
    ControllerBadRequest,
    ControllerMethodNotAllowed,
    ControllerUnknownVerb,
    refusal,
)


class ControllerView(Protocol):
    """The read-only side of an InferenceController that every answer is built from."""

    def status_patch(self) -> dict[str, Any]: ...

    def engine_statuses(self) -> list[EngineStatus]: ...

    def serving_endpoints(self) -> list[str]: ...


class MemoryChangeLike(Protocol):
    """controller_runtime.controller.MemoryChange, by its fields."""

    @property
    def cells(self) -> Mapping[str, Sequence[str]]: ...

    @property
    def failed(self) -> Mapping[str, str]: ...


def cells_response(controller: ControllerView) -> CellsResponse:
    patch = controller.status_patch()
    return CellsResponse.model_validate(_cells_fields(controller, patch))


def _cells_fields(controller: ControllerView, patch: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "engines": list(controller.engine_statuses()),
        "weight_version": patch.get("weightVersion"),
        "rollout_id": patch.get("rolloutId"),
        "serving_endpoints": list(controller.serving_endpoints()),
        "lock": patch.get("lock") or None,
    }


def memory_change_response(controller: ControllerView, change: MemoryChangeLike | None) -> MemoryChangeResponse:
    """The cells afterwards and the change; a controller that reports no change (a stub) changed nothing."""
    fields = _cells_fields(controller, controller.status_patch())
    if change is not None:
        fields["changed"] = {cell: [MemoryTag(t) for t in tags] for cell, tags in change.cells.items()}
        fields["failed"] = dict(change.failed)
    return MemoryChangeResponse.model_validate(fields)


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


class EvalFleetLike(Protocol):
    """controller_runtime.evalpin.EvalFleet, by the one method an answer is built from."""

    def to_dict(self) -> dict[str, Any]: ...


def eval_response(fleet: EvalFleetLike | None) -> EvalFleetResponse:
    """controller_runtime.evalpin.EvalFleet -> the wire model, every field kept."""
    if fleet is None:
        return EvalFleetResponse(ok=False, skip_reason="not_configured")
    return EvalFleetResponse.model_validate(fleet.to_dict())


# -- the controller calls, one per verb --------------------------------------------------------


async def _prepare_rollout(c: Any, req: PrepareRolloutRequest) -> CellsResponse:
    # Optional fields go through only when sent: a controller stand-in with the old signature still answers.
    await c.prepare_rollout(req.rollout_id, **({} if req.wait_seconds is None else {"wait_seconds": req.wait_seconds}))
    return cells_response(c)


async def _offload(c: Any, req: TagsRequest) -> MemoryChangeResponse:
    return memory_change_response(c, await c.offload(req.tags))


async def _onload(c: Any, req: TagsRequest) -> MemoryChangeResponse:
    return memory_change_response(c, await c.onload(req.tags))


async def _start_update_weights(c: Any, req: StartUpdateRequest) -> UpdateWindowResponse:
    ready = {} if req.ready_timeout_seconds is None else {"ready_timeout": req.ready_timeout_seconds}
    return window_response(await c.start_update_weights(req.holder, **ready))


async def _end_update_weights(c: Any, req: EndUpdateRequest) -> CellsResponse:
    await c.end_update_weights(req.snapshot, weight_version=req.weight_version,
                               expected_checksums=req.expected_checksums)
    return cells_response(c)


async def _abort_update_weights(c: Any, req: AbortUpdateRequest) -> AbortUpdateResponse:
    stopped = await c.abort_update_weights(req.snapshot)
    return AbortUpdateResponse(stopped=list(stopped or []))


async def _cells(c: Any, _req: None) -> CellsResponse:
    return cells_response(c)


async def _eval_fleet(c: Any, req: EvalFleetRequest | None) -> EvalFleetResponse:
    if req is None or (req.checkpoint is None and req.weight_version is None):
        return eval_response(await c.eval_fleet())  # pinned to the spec's checkpoint
    return eval_response(await c.eval_fleet(checkpoint=req.checkpoint, weight_version=req.weight_version))


async def _record_eval(c: Any, req: RecordEvalRequest) -> EvalStatus:
    recorded: EvalStatus = await c.record_eval(req)
    return recorded


@dataclass(frozen=True)
class Verb:
    """One verb. `methods[0]` is what the clients send; a server accepts any of `methods`."""

    name: str
    methods: tuple[str, ...]
    request: type[ApiModel] | None
    response: type[ApiModel]
    call: Callable[[Any, Any], Awaitable[ApiModel]]
    writes_status: bool

    @property
    def method(self) -> str:
        return self.methods[0]

    def parse(self, body: Mapping[str, Any]) -> ApiModel | None:
        """The request model of a decoded body (pydantic's ValidationError answers BadRequest)."""
        return None if self.request is None else self.request.model_validate(body)


VERBS: dict[str, Verb] = {
    v.name: v
    for v in (
        Verb("prepare_rollout", ("POST",), PrepareRolloutRequest, CellsResponse, _prepare_rollout, True),
        Verb("offload", ("POST",), TagsRequest, MemoryChangeResponse, _offload, True),
        Verb("onload", ("POST",), TagsRequest, MemoryChangeResponse, _onload, True),
        Verb("start_update_weights", ("POST",), StartUpdateRequest, UpdateWindowResponse, _start_update_weights, True),
        Verb("end_update_weights", ("POST",), EndUpdateRequest, CellsResponse, _end_update_weights, True),
        Verb("abort_update_weights", ("POST",), AbortUpdateRequest, AbortUpdateResponse, _abort_update_weights, True),
        Verb("cells", ("GET",), None, CellsResponse, _cells, False),
        Verb("eval_fleet", ("POST", "GET"), EvalFleetRequest, EvalFleetResponse, _eval_fleet, False),
        Verb("record_eval", ("POST",), RecordEvalRequest, EvalStatus, _record_eval, True),
    )
}


def verb_for(name: str, method: str) -> Verb:
    """The verb a request names, or the refusal a server answers with."""
    verb = VERBS.get(name)
    if verb is None:
        raise refusal(ControllerUnknownVerb, f"unknown verb {name!r}; one of {sorted(VERBS)}")
    if method not in verb.methods:
        raise refusal(ControllerMethodNotAllowed, f"{name} takes {' or '.join(verb.methods)}")
    return verb


def decode_body(text: str) -> dict[str, Any]:
    """A request body as the verbs take it: empty is `{}`, anything but a JSON object is BadRequest."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise refusal(ControllerBadRequest, f"body is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise refusal(ControllerBadRequest, "body must be a JSON object")
    return data


async def dispatch(verb: Verb, controller: Any, body: Mapping[str, Any]) -> ApiModel:
    """Validate `body` against the verb's request model and make the controller call."""
    return await verb.call(controller, verb.parse(body))
