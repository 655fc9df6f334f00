"""One training step as the progress display, the summary and `rljob run` read it (one JSON line each)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepRecord:
    """One step as the progress display and the summary see it."""

    step: int
    weight_version: int
    reward_mean: float
    reward_std: float
    loss: float
    samples: int
    response_tokens: int
    batch_weight_versions: list[int] = field(default_factory=list)
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    sync_seconds: float = 0.0
    step_seconds: float = 0.0
    update_attempts: int = 1
    ratio_mean: float = 1.0  # mean pi_train / pi_engine over the batch's response tokens
    clipped_fraction: float = 0.0  # response tokens the off-policy correction clipped or capped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
