"""Samples that failed (a reward or rollout function that raised, timed out, or returned a
malformed sample) and the budget of them a rollout tolerates before it fails.

A failure marks one sample, never the rollout: it is recorded here, counted in a metric and
carried into the batch's meta. Only past `spec.rollout.failureBudget` (a fraction of the
rollout's samples) does the rollout fail, with the first failure's message as the cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rljob_client.errors import RLJobError

from rollout_executor.samples import SampleKey


class FailureBudgetExceeded(RLJobError):
    """Too many of a rollout's samples failed; the message names the first cause."""


@dataclass(frozen=True)
class SampleFailure:
    key: SampleKey
    prompt_index: int
    source: str  # "reward" or "rollout" (the rollout function)
    reason: str  # error, timeout, worker_died, not_a_number, malformed
    message: str
    dropped: bool  # taken out of its group (else kept with the configured reward)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.key.group, "sample": self.key.sample, "prompt_index": self.prompt_index,
                "source": self.source, "reason": self.reason, "error": self.message[:500], "dropped": self.dropped}


def allowed_failures(budget: float, total: int) -> int:
    """How many of `total` samples may fail: floor(budget x total)."""
    return int(budget * total + 1e-9)


def check_budget(failures: dict[SampleKey, SampleFailure], budget: float, total: int, rollout_id: int) -> None:
    """Raise FailureBudgetExceeded once more than the budget's share of samples failed."""
    allowed = allowed_failures(budget, total)
    if len(failures) <= allowed:
        return
    first = min(failures.values(), key=lambda f: (f.key.group, f.key.sample))
    by_reason: dict[str, int] = {}
    for f in failures.values():
        by_reason[f"{f.source}/{f.reason}"] = by_reason.get(f"{f.source}/{f.reason}", 0) + 1
    raise FailureBudgetExceeded(
        f"rollout {rollout_id}: {len(failures)} of {total} samples failed ({by_reason}), more than "
        f"spec.rollout.failureBudget {budget:g} allows ({allowed}); first: {first.message}"
    )
