"""Controller events: what the operator turns into Kubernetes Events and local mode prints.

Plain data with a stable `reason` vocabulary (CamelCase, as Kubernetes event reasons are),
so the operator's event writer and the CLI's printer need no knowledge of the controller.
"""

from __future__ import annotations

from dataclasses import dataclass


class Reason:
    """Event reasons the controller emits."""

    CellCreated = "CellCreated"
    CellStarting = "CellStarting"
    CellPendingWeights = "CellPendingWeights"
    CellServing = "CellServing"
    CellUnhealthy = "CellUnhealthy"
    CellReplaced = "CellReplaced"
    CellDeleted = "CellDeleted"
    StartupDeadlineExceeded = "StartupDeadlineExceeded"
    SchedulingDeadlineExceeded = "SchedulingDeadlineExceeded"
    RestartBudgetExhausted = "RestartBudgetExhausted"
    Offloaded = "Offloaded"
    Onloaded = "Onloaded"
    RolloutPrepared = "RolloutPrepared"
    WindowOpened = "WindowOpened"
    WeightsUpdated = "WeightsUpdated"
    WindowAborted = "WindowAborted"
    LockExpired = "LockExpired"
    WeightCheckFailed = "WeightCheckFailed"
    EvalSkipped = "EvalSkipped"
    ReconcileError = "ReconcileError"


# How a weight-update window closed; its closing event (WeightsUpdated or WindowAborted) says it.
WINDOW_OUTCOMES = ("completed", "aborted", "expired", "check_failed")


@dataclass(frozen=True)
class ControllerEvent:
    reason: str
    message: str
    cell: str | None = None
    warning: bool = False
    # Set on the one event that closes a weight-update window: how it closed (see WINDOW_OUTCOMES).
    outcome: str | None = None

    @property
    def type(self) -> str:
        """Kubernetes event type."""
        return "Warning" if self.warning else "Normal"

    def __str__(self) -> str:
        where = f" [{self.cell}]" if self.cell else ""
        return f"{self.type} {self.reason}{where}: {self.message}"
