"""What the operator observed and did: `RLJob.status`, written by the operator alone.

Everything the controller needs to continue after a restart or failover is here (cell
states, restart counts, weight version, the open update window's lock and snapshot), so no
truth lives only in the operator's memory.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from controller_runtime.api.base import ApiModel


class Phase(StrEnum):
    Pending = "Pending"
    Starting = "Starting"
    Running = "Running"
    Suspended = "Suspended"
    Succeeded = "Succeeded"
    Failed = "Failed"


class CellState(StrEnum):
    Pending = "Pending"
    Starting = "Starting"
    PendingWeights = "PendingWeights"
    Serving = "Serving"
    Offloaded = "Offloaded"
    Unhealthy = "Unhealthy"
    Failed = "Failed"


class ConditionType(StrEnum):
    Ready = "Ready"
    EnginesHealthy = "EnginesHealthy"
    Progressing = "Progressing"
    Suspended = "Suspended"
    Failed = "Failed"


class Condition(ApiModel):
    type: str
    status: str = Field(pattern="^(True|False|Unknown)$")
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class EngineStatus(ApiModel):
    """One engine cell as `kubectl describe` shows it."""

    name: str
    index: int = 0
    state: CellState = CellState.Pending
    generation: int = Field(0, description="Bumped on every recreation; a window snapshot remembers it.")
    pods: list[str] = Field(default_factory=list)
    endpoint: str | None = None
    memory: list[str] = Field(default_factory=list, description="Memory tags currently released (offloaded).")
    state_before_offload: CellState | None = Field(None, description="The state an Offloaded cell returns to once its weights are onloaded.")
    weight_version: str | None = None
    consecutive_failures: int = 0
    restarts: int = 0
    pod_restarts: int = Field(0, description="Container restarts last observed on the cell's pods; an increase means the engine lost its weights.")
    last_probe_time: str | None = None
    last_transition_time: str | None = None
    next_restart_time: str | None = Field(None, description="When a backed-off recreation is due.")
    message: str = ""


class LockStatus(ApiModel):
    """The controller lock held by an open weight-update window."""

    holder: str
    since: str
    expires: str
    snapshot: dict[str, int] = Field(default_factory=dict, description="cell name -> generation at window start.")
    weights_checksums: dict[str, dict[str, str]] | None = None


class RLJobStatus(ApiModel):
    model_config = ApiModel.model_config | {"extra": "ignore"}

    phase: Phase = Phase.Pending
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    engines: list[EngineStatus] = Field(default_factory=list)
    weight_version: str | None = None
    rollout_id: int | None = None
    lock: LockStatus | None = None
    ready_engines: int = 0
    total_engines: int = 0
    ready: str = Field("0/0", description="ready/total engine cells, for the printer column.")
    restarts_total: int = 0
    start_time: str | None = None
    completion_time: str | None = None
