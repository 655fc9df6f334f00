"""The RLJob API (group rljob.io, version v1alpha1): pydantic models, the one source of truth."""

from controller_runtime.api.spec import (
    DatasetSpec,
    Engine,
    EvalFleetSpec,
    HealthCheckSpec,
    InferenceSpec,
    MemoryTag,
    ModelSpec,
    OffloadSpec,
    PauseMode,
    RestartPolicySpec,
    RewardSpec,
    RLJobManifest,
    RLJobSpec,
    RolloutSpec,
    SamplingSpec,
    TrainerSpec,
    WeightUpdateSpec,
)
from controller_runtime.api.status import (
    CellState,
    Condition,
    ConditionType,
    EngineStatus,
    LockStatus,
    Phase,
    RLJobStatus,
)

GROUP = "rljob.io"
VERSION = "v1alpha1"
PLURAL = "rljobs"
KIND = "RLJob"

__all__ = [
    "GROUP", "KIND", "PLURAL", "VERSION",
    "CellState", "Condition", "ConditionType", "DatasetSpec", "Engine", "EngineStatus", "EvalFleetSpec",
    "HealthCheckSpec", "InferenceSpec", "LockStatus", "MemoryTag", "ModelSpec", "OffloadSpec", "PauseMode",
    "Phase", "RLJobManifest", "RLJobSpec", "RLJobStatus", "RestartPolicySpec", "RewardSpec", "RolloutSpec",
    "SamplingSpec", "TrainerSpec", "WeightUpdateSpec",
]
