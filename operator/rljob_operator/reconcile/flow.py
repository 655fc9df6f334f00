"""The result of one reconcile step: continue, come back later, or stop this pass.

Grove's `common/flow.go` in Python: each step is a small async function returning a
`StepResult`, and `run_steps` runs them in order until one does not continue. The reason
travels into logs and metrics so a stuck job says which step holds it and why.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    proceed = "continue"
    requeue = "requeue"
    stop = "stop"


@dataclass(frozen=True)
class StepResult:
    outcome: Outcome
    reason: str = ""
    after: float | None = None  # seconds, for requeue

    @classmethod
    def proceed(cls) -> StepResult:
        return cls(Outcome.proceed)

    @classmethod
    def requeue(cls, after: float, reason: str) -> StepResult:
        return cls(Outcome.requeue, reason, after)

    @classmethod
    def stop(cls, reason: str) -> StepResult:
        return cls(Outcome.stop, reason)


Step = Callable[[], Awaitable[StepResult]]


async def run_steps(steps: Sequence[tuple[str, Step]]) -> tuple[str, StepResult]:
    """Run steps in order; the first that does not continue ends the pass (its name returned)."""
    for name, step in steps:
        result = await step()
        if result.outcome is not Outcome.proceed:
            return name, result
    return "", StepResult.proceed()
