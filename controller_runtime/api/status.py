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
    Admitted = "Admitted"  # only on jobs queued through Kueue (label kueue.x-k8s.io/queue-name)
    TrainerWorkload = "TrainerWorkload"  # only on jobs whose trainer is spec.trainer.workloadRef


class Condition(ApiModel):
    """A Kubernetes-style condition (same fields as metav1.Condition)."""

    type: str = Field(description="Ready, EnginesHealthy, Progressing, Suspended, Failed; Admitted (Kueue) and TrainerWorkload (workloadRef) where they apply.")
    status: str = Field(pattern="^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason of the last transition.")
    message: str = Field(default="", description="What happened, for a person.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="metadata.generation the condition was computed from.")


class EngineStatus(ApiModel):
    """One engine cell as `kubectl describe` shows it."""

    name: str = Field(description="Cell name, <job>-cell-<index> (eval cells: <job>-eval-<index>).")
    index: int = Field(default=0, description="Cell index in the fleet.")
    state: CellState = Field(default=CellState.Pending, description="Pending, Starting, PendingWeights, Serving, Offloaded, Unhealthy or Failed.")
    generation: int = Field(default=0, description="Bumped on every recreation; a window snapshot remembers it.")
    pods: list[str] = Field(default_factory=list, description="Pods of the cell (several for a multi-node cell).")
    endpoint: str | None = Field(default=None, description="Base URL of the cell's engine HTTP API.")
    memory: list[str] = Field(default_factory=list, description="Memory tags currently released (offloaded).")
    state_before_offload: CellState | None = Field(default=None, description="The state an Offloaded cell returns to once its weights are onloaded.")
    weight_version: str | None = Field(default=None, description="Weight version the engine reports.")
    consecutive_failures: int = Field(default=0, description="Failed health probes in a row.")
    restarts: int = Field(default=0, description="Recreations so far (counted against spec.inference.restartPolicy.maxRestarts).")
    pod_restarts: int = Field(default=0, description="Container restarts last observed on the cell's pods; an increase means the engine lost its weights.")
    last_probe_time: str | None = Field(default=None, description="When the cell was last probed (RFC 3339).")
    last_transition_time: str | None = Field(default=None, description="When the state last changed (RFC 3339).")
    next_restart_time: str | None = Field(default=None, description="When a backed-off recreation is due.")
    message: str = Field(default="", description="Why the cell is in its state, for a person.")


class LockStatus(ApiModel):
    """The controller lock held by an open weight-update window."""

    holder: str = Field(description="Who holds the lock (the caller's identity).")
    since: str = Field(description="When the window opened (RFC 3339).")
    expires: str = Field(description="When the window is aborted unless ended first (RFC 3339).")
    snapshot: dict[str, int] = Field(default_factory=dict, description="cell name -> generation at window start.")
    weights_checksums: dict[str, dict[str, str]] | None = Field(default=None, description="cell name -> parameter -> checksum before the update (spec.inference.weightUpdate.checkWeights).")


class EvalStatus(ApiModel):
    """The last evaluation of the policy (spec.rollout.eval), as the executor measured it."""

    step: int = Field(ge=0, description="Training steps done when the policy was evaluated.")
    weight_version: str | None = Field(default=None, description="Weight version the eval samples were generated under.")
    reward: float = Field(description="Mean reward over the eval samples.")
    pass_at_1: float = Field(ge=0, le=1, description="Fraction of eval samples whose reward reached the success threshold (spec.rollout.eval.successThreshold).")
    samples: int = Field(default=0, ge=0, description="Eval samples scored (prompts x samplesPerPrompt).")
    fleet: str = Field(default="policy", description="Where the samples came from: policy (the training fleet) or eval (the eval fleet, re-pinned to the step's weights).")
    time: str | None = Field(default=None, description="When the controller recorded it (RFC 3339).")


class QueueStatus(ApiModel):
    """The job's place in Kueue (jobs labelled kueue.x-k8s.io/queue-name)."""

    name: str = Field(description="The LocalQueue (label kueue.x-k8s.io/queue-name).")
    workload: str = Field(default="", description="The Workload the job is admitted as.")
    state: str = Field(description="Pending (waiting for quota), Admitted, Evicted (suspending after a preemption or quota change) or Finished.")
    reason: str = Field(default="", description="Kueue's reason (e.g. Pending, Preempted, Admitted).")
    message: str = Field(default="", description="Kueue's message, e.g. why the Workload does not fit.")
    flavors: list[str] = Field(default_factory=list, description="ResourceFlavors assigned to each PodSet while admitted, as `podset: flavor,...` (engines, executor, ray-head, ray-workers, trainer).")


class RLJobStatus(ApiModel):
    """What the operator observed and did; written by the operator alone."""

    model_config = ApiModel.model_config | {"extra": "ignore"}

    phase: Phase = Field(default=Phase.Pending, description="Pending, Starting, Running, Suspended, Succeeded or Failed.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, EnginesHealthy, Progressing, Suspended, Failed.")
    observed_generation: int | None = Field(default=None, description="metadata.generation the status was computed from.")
    engines: list[EngineStatus] = Field(default_factory=list, description="One entry per engine cell.")
    weight_version: str | None = Field(default=None, description="Weight version the serving engines hold.")
    rollout_id: int | None = Field(default=None, description="Last rollout handed to the trainers.")
    lock: LockStatus | None = Field(default=None, description="The open weight-update window, if any.")
    last_eval: EvalStatus | None = Field(default=None, description="The last evaluation of the policy (spec.rollout.eval): step, mean reward, pass@1.")
    ready_engines: int = Field(default=0, description="Cells Serving.")
    total_engines: int = Field(default=0, description="Cells desired.")
    ready: str = Field(default="0/0", description="ready/total engine cells, for the printer column.")
    restarts_total: int = Field(default=0, description="Cell recreations over the job's life.")
    trainer_restarts: int = Field(
        default=0,
        description="Times the trainer pods were recreated together after a rank failed (spec.trainer.maxRestarts bounds it).",
    )
    start_time: str | None = Field(default=None, description="When the job started (RFC 3339).")
    completion_time: str | None = Field(default=None, description="When the job Succeeded or Failed (RFC 3339).")
    queue: QueueStatus | None = Field(default=None, description="Kueue's decision, for jobs queued through Kueue.")
