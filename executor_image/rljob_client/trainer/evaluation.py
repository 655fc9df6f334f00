"""When the reference trainer evaluates its policy (spec.rollout.eval), and what it keeps of it.

The executor does the evaluating (it owns the engines, the eval set and the reward) and
records status.lastEval through the controller API; the trainer only knows *when*: after
every `everySteps` steps and after the last one, on the writer rank, right after the step's
weights are live and before the next rollout is asked for. It learns `everySteps` from the
executor (`RolloutStream.eval_every_steps`, read from the spec the executor runs), so a trainer
pod needs no flag of its own, and hands over the step's exported weights directory, which an
eval fleet is re-pinned to (miles V2 pins per eval point).

An eval that fails (an engine error, a reward that raises) is a skipped point with the reason:
evaluation never stops training.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

# The executor's eval call, blocking (RolloutStream.eval): (eval point, weight version, checkpoint dir) -> result.
EvalCall = Callable[[int, int, str | None], dict[str, Any]]


def eval_due(steps_done: int, every_steps: int, last_step: int) -> bool:
    """After every `every_steps` steps, and after the last one (the policy the run ends with)."""
    return every_steps > 0 and steps_done > 0 and (steps_done % every_steps == 0 or steps_done == last_step)


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of the policy, as the summary, the reward curve and status.lastEval see it."""

    step: int  # training steps done
    weight_version: str | None
    reward: float | None  # mean reward over the eval samples (None: skipped)
    pass_at_1: float | None
    samples: int = 0
    fleet: str | None = None  # policy | eval
    seconds: float = 0.0
    skipped: bool = False
    reason: str | None = None

    @classmethod
    def from_result(cls, step: int, out: dict[str, Any], seconds: float) -> EvalPoint:
        if out.get("skipped"):
            return cls(step, None, None, None, seconds=seconds, skipped=True,
                       reason=f"{out.get('reason')}: {out.get('detail', '')}".rstrip(": "))
        version = out.get("weight_version")
        return cls(step, None if version is None else str(version), float(out["mean_reward"]), float(out["pass_at_1"]),
                   int(out.get("n", 0)), out.get("fleet"), seconds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PolicyEvaluator:
    """Asks the executor to evaluate when an eval point is due; keeps the points in order."""

    def __init__(self, every_steps: int, last_step: int, evaluate: EvalCall,
                 checkpoint_for: Callable[[int], str | None] | None = None,
                 on_point: Callable[[EvalPoint], None] | None = None) -> None:
        self.every_steps = every_steps
        self.last_step = last_step
        self.evaluate = evaluate
        self.checkpoint_for = checkpoint_for or (lambda _version: None)
        self.on_point = on_point
        self.points: list[EvalPoint] = []

    @classmethod
    def from_stream(cls, stream: Any, last_step: int, checkpoint_for: Callable[[int], str | None] | None = None,
                    on_point: Callable[[EvalPoint], None] | None = None) -> PolicyEvaluator | None:
        """None when the job does not evaluate its policy (no spec.rollout.eval)."""
        every = int(stream.eval_every_steps)
        return cls(every, last_step, stream.eval, checkpoint_for, on_point) if every > 0 else None

    async def after_update(self, steps_done: int) -> EvalPoint | None:
        """Evaluate the weights of `steps_done` steps (weight version `steps_done`) if that is an eval point."""
        if not eval_due(steps_done, self.every_steps, self.last_step):
            return None
        started = time.monotonic()
        checkpoint = self.checkpoint_for(steps_done)
        try:
            out = await asyncio.to_thread(self.evaluate, steps_done, steps_done, checkpoint)
        except Exception as exc:
            log.warning("eval at step %d failed: %s", steps_done, exc)
            out = {"skipped": True, "reason": "failed", "detail": f"{type(exc).__name__}: {exc}"}
        point = EvalPoint.from_result(steps_done, out, time.monotonic() - started)
        log.info("eval at step %d: %s", steps_done, point)
        self.points.append(point)
        if self.on_point is not None:
            self.on_point(point)
        return point
