"""Whether a failed trainer Job is started again, and as which attempt. Pure.

One failed rank breaks the process group of every rank, so the trainer is restarted as a gang:
the operator deletes the failed Job and creates it again, and every rank resumes from the same
newest checkpoint (what JobSet's `failurePolicy.maxRestarts` and Kubeflow's PyTorchJob do for a
torch job). Recreating only the failed index (`backoffLimitPerIndex > 0`) was the other choice;
it was not taken because the new rank would rendezvous while the survivors still sit in the
broken group (their collectives time out only later), and one fault would spend the budget once
per rank as each survivor fails in turn.

The attempt number lives on the Job (annotation `rljob.io/trainer-attempt`) and in
`status.trainerRestarts`; the larger of the two counts, so a replica that takes over between
the delete and the status write never grants the budget twice.

The first restart is immediate (a lost node or a preempted pod is the usual cause, and waiting
only idles the engines); later ones back off, 10 s doubling to at most 5 min, as the kubelet
backs off a crash-looping container: a trainer that fails at once on every start would
otherwise spend its whole budget in seconds, before anyone could read the first failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from controller_runtime.api.spec import TrainerSpec
from rljob_operator import labels as L
from rljob_operator.reconcile.job_status import TrainerState

REASON_FAILED = "TrainerFailed"
REASON_BUDGET = "TrainerRestartBudgetExhausted"
REASON_BACKOFF = "TrainerRestartBackoff"
BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0


class TrainerAction(StrEnum):
    keep = "keep"  # running, finished well, or absent: nothing to decide
    restart = "restart"  # delete the failed Job and create attempt `attempt`
    wait = "wait"  # restart `attempt` is due in `after` seconds (backoff): the failed Job stays
    fail = "fail"  # the job fails with `reason` and `message`


@dataclass(frozen=True)
class TrainerVerdict:
    action: TrainerAction
    attempt: int  # the attempt the trainer Job should be (restarts so far, this one included)
    reason: str = ""
    message: str = ""
    after: float = 0.0  # wait: seconds until the restart is due


def restart_backoff(attempt: int) -> float:
    """Seconds between the failure and restart `attempt` (1-based): none for the first."""
    if attempt <= 1:
        return 0.0
    return min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 2))


def job_attempt(job: Mapping[str, Any] | None) -> int:
    """The attempt a live trainer Job says it is (0 when absent or unannotated)."""
    value = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(
        L.TRAINER_ATTEMPT_ANNOTATION, "0"
    )
    return int(value) if str(value).isdigit() else 0


def decide_trainer(
    trainer: TrainerSpec, state: TrainerState, message: str, attempt: int, failed_for: float = float("inf")
) -> TrainerVerdict:
    """What to do about the trainer Job of attempt `attempt` in `state` (its failure in `message`,
    `failed_for` seconds ago)."""
    if state is not TrainerState.failed:
        return TrainerVerdict(TrainerAction.keep, attempt)
    if trainer.max_restarts == 0:
        return TrainerVerdict(
            TrainerAction.fail,
            attempt,
            REASON_FAILED,
            f"{message}; not restarted: spec.trainer.maxRestarts is 0",
        )
    if not trainer.resumes:
        return TrainerVerdict(
            TrainerAction.fail,
            attempt,
            REASON_FAILED,
            f"{message}; not restarted: spec.trainer.reference.saveEverySteps is 0, so there is "
            "no checkpoint to resume from (set it to let a failed trainer restart)",
        )
    if attempt >= trainer.max_restarts:
        return TrainerVerdict(
            TrainerAction.fail,
            attempt,
            REASON_BUDGET,
            f"{message}; spec.trainer.maxRestarts ({trainer.max_restarts}) restarts spent",
        )
    wait = restart_backoff(attempt + 1) - failed_for
    if wait > 0:
        return TrainerVerdict(
            TrainerAction.wait,
            attempt + 1,
            REASON_BACKOFF,
            f"{message}; restart {attempt + 1} of {trainer.max_restarts} after a backoff of "
            f"{restart_backoff(attempt + 1):.0f} s",
            after=wait,
        )
    return TrainerVerdict(TrainerAction.restart, attempt + 1, message=message)
