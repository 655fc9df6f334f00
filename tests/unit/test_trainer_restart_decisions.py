"""A failed trainer Job: restarted as a gang within the budget, or the job fails saying why."""

from __future__ import annotations

from typing import Any

import pytest
from rljob_operator.reconcile.job_status import TrainerState, trainer_state
from rljob_operator.reconcile.trainer_restart import (
    REASON_BACKOFF,
    REASON_BUDGET,
    REASON_FAILED,
    TrainerAction,
    decide_trainer,
    job_attempt,
    restart_backoff,
)

from controller_runtime.api.spec import TrainerSpec

FAILED = "trainer Job failed: MaxFailedIndexesExceeded (failed rank: 1)"


def trainer(**fields: Any) -> TrainerSpec:
    return TrainerSpec.model_validate(fields)


def test_a_failed_reference_trainer_with_checkpoints_is_restarted_as_the_next_attempt() -> None:
    v = decide_trainer(trainer(reference={"saveEverySteps": 5}), TrainerState.failed, FAILED, 0)
    assert (v.action, v.attempt, v.message) == (TrainerAction.restart, 1, FAILED)


def test_the_default_budget_is_three_restarts_then_the_job_fails_naming_it() -> None:
    t = trainer(reference={"saveEverySteps": 5})
    assert t.max_restarts == 3
    assert decide_trainer(t, TrainerState.failed, FAILED, 2).action is TrainerAction.restart
    v = decide_trainer(t, TrainerState.failed, FAILED, 3)
    assert (v.action, v.attempt, v.reason) == (TrainerAction.fail, 3, REASON_BUDGET)
    assert v.message.startswith(FAILED) and "spec.trainer.maxRestarts (3) restarts spent" in v.message


def test_a_reference_trainer_without_checkpoints_is_not_restarted_and_the_message_says_why() -> None:
    v = decide_trainer(trainer(), TrainerState.failed, FAILED, 0)
    assert (v.action, v.reason) == (TrainerAction.fail, REASON_FAILED)
    assert "saveEverySteps is 0" in v.message and "no checkpoint to resume from" in v.message


def test_a_trainer_command_of_ones_own_is_restarted_unless_restarts_are_off() -> None:
    assert (
        decide_trainer(trainer(command=["train"]), TrainerState.failed, FAILED, 0).action
        is TrainerAction.restart
    )
    v = decide_trainer(trainer(command=["train"], maxRestarts=0), TrainerState.failed, FAILED, 0)
    assert (v.action, v.reason) == (TrainerAction.fail, REASON_FAILED) and "maxRestarts is 0" in v.message


@pytest.mark.parametrize("state", [TrainerState.running, TrainerState.succeeded, TrainerState.absent])
def test_a_trainer_that_did_not_fail_is_left_alone(state: TrainerState) -> None:
    v = decide_trainer(trainer(reference={"saveEverySteps": 5}), state, "", 2)
    assert (v.action, v.attempt) == (TrainerAction.keep, 2)


def test_the_attempt_is_read_from_the_jobs_annotation() -> None:
    assert job_attempt(None) == 0
    assert job_attempt({"metadata": {}}) == 0
    assert job_attempt({"metadata": {"annotations": {"rljob.io/trainer-attempt": "2"}}}) == 2


def test_the_failed_rank_is_named_from_the_jobs_failed_indexes() -> None:
    job = {
        "status": {
            "failedIndexes": "1",
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "MaxFailedIndexesExceeded",
                    "message": "Job has exceeded maxFailedIndexes",
                }
            ],
        }
    }
    state, message = trainer_state(job)
    assert state is TrainerState.failed
    assert (
        message
        == "trainer Job failed: MaxFailedIndexesExceeded Job has exceeded maxFailedIndexes (failed rank: 1)"
    )


def test_max_restarts_is_bounded_in_the_model() -> None:
    with pytest.raises(ValueError, match=r"max_restarts|maxRestarts"):
        trainer(maxRestarts=-1)


def test_restarts_back_off_10_s_doubling_to_5_min_after_an_immediate_first() -> None:
    assert [restart_backoff(n) for n in range(1, 8)] == [0, 10, 20, 40, 80, 160, 300]
    assert restart_backoff(30) == 300


def test_a_trainer_failing_again_waits_out_its_backoff_then_restarts() -> None:
    t = trainer(reference={"saveEverySteps": 5}, maxRestarts=5)
    assert decide_trainer(t, TrainerState.failed, FAILED, 0, failed_for=0).action is TrainerAction.restart
    v = decide_trainer(t, TrainerState.failed, FAILED, 2, failed_for=5)
    assert (v.action, v.attempt, v.reason, v.after) == (TrainerAction.wait, 3, REASON_BACKOFF, 15)
    assert v.message.startswith(FAILED) and "restart 3 of 5 after a backoff of 20 s" in v.message
    assert decide_trainer(t, TrainerState.failed, FAILED, 2, failed_for=20).action is TrainerAction.restart
    # The budget is judged before the backoff: a spent budget fails at once.
    assert decide_trainer(t, TrainerState.failed, FAILED, 5, failed_for=0).action is TrainerAction.fail
