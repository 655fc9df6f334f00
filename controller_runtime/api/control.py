"""Wire models of the controller API (operator and local-mode servers <-> trainer-side clients).

The verbs that use them are one table, `controller_runtime.api.verbs`; the error answers are
another, `controller_runtime.api.wire_errors`. Paths, per job:

    POST {base}/apis/control.rljob.io/v1alpha1/namespaces/{ns}/rljobs/{name}/{verb}
    GET  {base}/apis/control.rljob.io/v1alpha1/namespaces/{ns}/rljobs/{name}/cells

Callers send `Authorization: Bearer <ServiceAccount token>`; the operator checks it with
TokenReview and SubjectAccessReview (`update` on `rljobs/control`). A standby operator
replica answers 503 with `Retry-After`.
"""

from __future__ import annotations

from pydantic import Field

from controller_runtime.api.base import ApiModel
from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import EngineStatus, LockStatus

API_PREFIX = "/apis/control.rljob.io/v1alpha1"
EVAL_PIN_WAIT_SECONDS = 600.0  # an eval_fleet that re-pins loads a checkpoint on every eval engine
PREPARE_WAIT_SECONDS = 30.0  # how long prepare_rollout waits for an open window by default


def job_path(namespace: str, name: str, verb: str) -> str:
    return f"{API_PREFIX}/namespaces/{namespace}/rljobs/{name}/{verb}"


class PrepareRolloutRequest(ApiModel):
    rollout_id: int = Field(ge=0)
    wait_seconds: float | None = Field(default=None, ge=0, description=(
        "How long to wait for an open update window to close before answering LockHeld "
        f"(default {PREPARE_WAIT_SECONDS:g} s; 0: refuse at once)."))


class TagsRequest(ApiModel):
    tags: list[MemoryTag] = Field(default_factory=lambda: list(MemoryTag))


class StartUpdateRequest(ApiModel):
    holder: str = Field(min_length=1, description="Who opens the window (trainer pod name); shown in status.lock.")
    ready_timeout_seconds: float | None = Field(default=None, ge=0, description=(
        "Wait up to this long for cells that are starting before the window opens over the "
        "ready ones (spec.inference.weightUpdate.readyTimeoutSeconds; absent: no wait)."))


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
    expected_checksums: dict[str, str] | None = Field(
        default=None, description="tensor -> sha256 of what the trainer sent; every participant must report exactly these."
    )


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


class MemoryChangeResponse(CellsResponse):
    """offload/onload: the cells afterwards, plus what moved where and which engines refused.

    A cell in `failed` still holds (offload) or still lacks (onload) the memory it was asked
    to move; the clients raise MemoryChangeFailed for it rather than let a trainer train on
    GPUs an engine did not release.
    """

    changed: dict[str, list[MemoryTag]] = Field(default_factory=dict, description="cell -> tags it released/took back.")
    failed: dict[str, str] = Field(default_factory=dict, description="cell -> why its engine refused.")


class EvalFleetResponse(ApiModel):
    """The eval fleet as plain data: the executor never receives controller state."""

    endpoints: list[str] = Field(default_factory=list)
    pinned_version: str | None = None
    checkpoint: str | None = None
    ok: bool = False
    skip_reason: str | None = Field(default=None, description="pin_violation | unhealthy | not_configured | controller_unreachable")
    message: str = Field(default="", description="Why eval may not run, for a person.")
    versions: dict[str, str | None] = Field(default_factory=dict, description="endpoint -> weight version it reported.")


class EvalFleetRequest(ApiModel):
    """Pin the eval fleet to these weights instead of spec.inference.eval's (an eval point of the
    policy being trained: the step's exported weights); both absent: the spec's checkpoint."""

    checkpoint: str | None = Field(default=None, min_length=1, description="Weights directory every eval engine loads.")
    weight_version: str | None = Field(default=None, min_length=1, description="Version every eval engine must then report.")


class RecordEvalRequest(ApiModel):
    """An evaluation of the policy, for status.lastEval (the controller adds the time)."""

    step: int = Field(ge=0)
    weight_version: str | None = None
    reward: float
    pass_at_1: float = Field(ge=0, le=1)
    samples: int = Field(default=0, ge=0)
    fleet: str = "policy"


class ErrorResponse(ApiModel):
    error: str
    reason: str
    retry_after_seconds: float | None = None
