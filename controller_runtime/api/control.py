"""Wire format of the controller API (operator HTTP server <-> trainer-side client).

One module for both sides so that the server (rljob_operator.controller_api) and the client
(rljob_client.controller_client) cannot drift apart. Paths, per job:

    POST {base}/apis/control.rljob.io/v1alpha1/namespaces/{ns}/rljobs/{name}/{verb}
    GET  {base}/apis/control.rljob.io/v1alpha1/namespaces/{ns}/rljobs/{name}/cells

verbs: prepare_rollout, offload, onload, start_update_weights, end_update_weights,
abort_update_weights, eval_fleet. Callers send `Authorization: Bearer <ServiceAccount token>`;
the operator checks it with TokenReview and SubjectAccessReview (`update` on `rljobs/control`).
A standby operator replica answers 503 with `Retry-After`.
"""

from __future__ import annotations

from pydantic import Field

from controller_runtime.api.base import ApiModel
from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import EngineStatus, LockStatus

API_PREFIX = "/apis/control.rljob.io/v1alpha1"


def job_path(namespace: str, name: str, verb: str) -> str:
    return f"{API_PREFIX}/namespaces/{namespace}/rljobs/{name}/{verb}"


class PrepareRolloutRequest(ApiModel):
    rollout_id: int = Field(ge=0)


class TagsRequest(ApiModel):
    tags: list[MemoryTag] = Field(default_factory=lambda: list(MemoryTag))


class StartUpdateRequest(ApiModel):
    holder: str = Field(min_length=1, description="Who opens the window (trainer pod name); shown in status.lock.")


class EngineEndpoint(ApiModel):
    cell: str
    endpoint: str
    gpu_count: int
    gpu_offset: int
    generation: int


class UpdateWindowResponse(ApiModel):
    engines: list[EngineEndpoint]
    snapshot: dict[str, int]
    lock: LockStatus


class EndUpdateRequest(ApiModel):
    snapshot: dict[str, int]
    weight_version: str | None = None


class AbortUpdateRequest(ApiModel):
    snapshot: dict[str, int]


class AbortUpdateResponse(ApiModel):
    stopped: list[str] = Field(default_factory=list, description="Cells stopped because they took part in the aborted window.")


class CellsResponse(ApiModel):
    engines: list[EngineStatus]
    weight_version: str | None = None
    rollout_id: int | None = None
    serving_endpoints: list[str] = Field(default_factory=list)
    lock: LockStatus | None = None


class EvalFleetResponse(ApiModel):
    """The eval fleet as plain data: the executor never receives controller state."""

    endpoints: list[str] = Field(default_factory=list)
    pinned_version: str | None = None
    checkpoint: str | None = None
    ok: bool = False
    skip_reason: str | None = Field(None, description="pin_violation | unhealthy | not_configured | controller_unreachable")
    message: str = Field("", description="Why eval may not run, for a person.")
    versions: dict[str, str | None] = Field(default_factory=dict, description="endpoint -> weight version it reported.")


class ErrorResponse(ApiModel):
    error: str
    reason: str
    retry_after_seconds: float | None = None
