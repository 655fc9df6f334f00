from rljob_operator.conditions import find
from rljob_operator.reconcile.job_status import (
    Observed,
    TrainerState,
    build_status,
    quiet_delta,
    startup_progress,
    status_delta,
    trainer_state,
)

from controller_runtime.clock import iso

T0 = 1_800_000_000.0


def ctl(*states: str, lock: dict | None = None) -> dict:
    engines = [{"name": f"j-cell-{i}", "index": i, "state": s} for i, s in enumerate(states)]
    ready = sum(1 for s in states if s == "Serving")
    return {"engines": engines, "lock": lock, "weightVersion": None, "rolloutId": None,
            "readyEngines": ready, "totalEngines": len(states), "ready": f"{ready}/{len(states)}", "restartsTotal": 0}


def cond(status: dict, type_: str) -> tuple[str, str]:
    c = find(status["conditions"], type_)
    return c["status"], c["reason"]


def test_starting_fleet_is_not_ready_and_printer_counts_show_0_of_4():
    s, _ = build_status({}, Observed(now=T0, generation=1, replicas=4, controller=ctl("Starting", "Starting", "Pending", "Pending")))
    assert (s["phase"], s["ready"], s["observedGeneration"]) == ("Starting", "0/4", 1)
    assert cond(s, "Ready") == ("False", "EnginesNotReady")
    assert cond(s, "Progressing") == ("True", "EnginesStarting")


def test_all_serving_is_ready_and_running_with_start_time():
    s, changed = build_status({}, Observed(now=T0, replicas=2, controller=ctl("Serving", "Serving")))
    assert (s["phase"], s["ready"], s["startTime"]) == ("Running", "2/2", iso(T0))
    assert cond(s, "Ready") == ("True", "AllEnginesServing")
    assert cond(s, "EnginesHealthy") == ("True", "NoFailures")
    assert {c["type"] for c in changed} >= {"Ready", "EnginesHealthy"}


def test_unhealthy_cell_flips_engines_healthy_and_keeps_transition_time_until_it_recovers():
    s1, _ = build_status({}, Observed(now=T0, replicas=2, controller=ctl("Serving", "Serving")))
    s2, changed = build_status(s1, Observed(now=T0 + 5, replicas=2, controller=ctl("Serving", "Unhealthy")))
    assert cond(s2, "EnginesHealthy") == ("False", "CellsUnhealthy")
    assert [c["type"] for c in changed] == ["Ready", "EnginesHealthy", "Progressing"]
    s3, changed = build_status(s2, Observed(now=T0 + 9, replicas=2, controller=ctl("Serving", "Unhealthy")))
    assert changed == [] and find(s3["conditions"], "EnginesHealthy")["lastTransitionTime"] == iso(T0 + 5)


def test_one_exhausted_cell_degrades_but_every_exhausted_cell_fails_the_job():
    s, _ = build_status({}, Observed(now=T0, replicas=2, controller=ctl("Serving", "Failed")))
    assert s["phase"] == "Running" and cond(s, "EnginesHealthy") == ("False", "RestartBudgetExhausted")
    s, _ = build_status(s, Observed(now=T0 + 1, replicas=2, controller=ctl("Failed", "Failed")))
    assert s["phase"] == "Failed" and cond(s, "Failed") == ("True", "RestartBudgetExhausted")
    assert s["completionTime"] == iso(T0 + 1)


def test_terminal_phase_is_sticky():
    s, _ = build_status({}, Observed(now=T0, replicas=1, controller=ctl("Serving"), trainer=TrainerState.succeeded))
    assert s["phase"] == "Succeeded"
    s2, _ = build_status(s, Observed(now=T0 + 50, replicas=1, controller=ctl("Serving"), trainer=TrainerState.running))
    assert s2["phase"] == "Succeeded" and s2["completionTime"] == iso(T0)


def test_trainer_failure_fails_the_job_with_its_message():
    s, _ = build_status({}, Observed(now=T0, replicas=1, controller=ctl("Serving"), trainer=TrainerState.failed, trainer_message="trainer Job failed: BackoffLimitExceeded"))
    assert cond(s, "Failed") == ("True", "TrainerFailed")
    assert "BackoffLimitExceeded" in find(s["conditions"], "Failed")["message"]


def test_suspended_job_reports_pods_left_then_done_and_clears_engines():
    prev, _ = build_status({}, Observed(now=T0, replicas=2, controller=ctl("Serving", "Serving")))
    s, _ = build_status(prev, Observed(now=T0 + 1, replicas=2, suspend=True, controller=None, engine_pods_left=2))
    assert s["phase"] == "Suspended" and s["engines"] == [] and s["ready"] == "0/2"
    assert cond(s, "Suspended") == ("True", "SuspendedBySpec") and "2 left" in find(s["conditions"], "Suspended")["message"]
    assert cond(s, "Ready") == ("False", "Suspended") and cond(s, "Progressing") == ("False", "Suspended")
    s, _ = build_status(s, Observed(now=T0 + 2, replicas=2, suspend=True, controller=None))
    assert find(s["conditions"], "Suspended")["message"] == "engine and trainer pods deleted"


def test_open_window_shows_as_progressing_updating_weights():
    s, _ = build_status({}, Observed(now=T0, replicas=1, controller=ctl("Serving", lock={"holder": "trainer-0"})))
    assert cond(s, "Progressing") == ("True", "UpdatingWeights")


def test_trainer_state_from_job_conditions():
    assert trainer_state(None)[0] is TrainerState.absent
    assert trainer_state({"status": {}})[0] is TrainerState.running
    assert trainer_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})[0] is TrainerState.succeeded
    st, msg = trainer_state({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}})
    assert st is TrainerState.failed and "BackoffLimitExceeded" in msg


def test_status_delta_holds_only_changes_and_explicit_deletions():
    assert status_delta({"a": 1, "lock": {"h": 1}}, {"a": 1, "lock": None}) == {"lock": None}


def test_a_trainer_that_spent_its_restarts_fails_the_job_with_that_reason_and_the_count_stays():
    s, _ = build_status({}, Observed(now=T0, replicas=1, controller=ctl("Serving"), trainer=TrainerState.running,
                                     trainer_restarts=2))
    assert s["phase"] == "Running" and s["trainerRestarts"] == 2
    s, _ = build_status(s, Observed(now=T0 + 1, replicas=1, controller=ctl("Serving"), trainer=TrainerState.failed,
                                    trainer_message="rank 1 failed; spec.trainer.maxRestarts (2) restarts spent",
                                    trainer_reason="TrainerRestartBudgetExhausted"))
    failed = find(s["conditions"], "Failed")
    assert s["phase"] == "Failed" and (failed["reason"], failed["status"]) == ("TrainerRestartBudgetExhausted", "True")
    assert "maxRestarts (2)" in failed["message"] and s["trainerRestarts"] == 2  # never counted down


def test_what_probes_alone_change_is_not_news_but_a_written_count_is_kept_true():
    def engines(*cells: dict) -> dict:
        return {"engines": [{"name": f"j-cell-{i}", "state": "Serving", **c} for i, c in enumerate(cells)]}

    stored = engines({"lastProbeTime": "t0"}, {"lastProbeTime": "t0"})
    assert quiet_delta(stored, engines({"lastProbeTime": "t1"}, {"lastProbeTime": "t1"}), T0)
    # a failure below the threshold (0 -> 2, still Serving): not news
    assert quiet_delta(stored, engines({"lastProbeTime": "t1", "consecutiveFailures": 2}, {}), T0)
    # the threshold's verdict moves the state: news, with the count
    assert not quiet_delta(stored, {"engines": [{"name": "j-cell-0", "state": "Unhealthy", "consecutiveFailures": 3},
                                                {"name": "j-cell-1", "state": "Serving"}]}, T0)
    # a count that went out with another change is not left standing: its reset and its rise are news
    counted = engines({"consecutiveFailures": 1}, {})
    assert not quiet_delta(counted, engines({"consecutiveFailures": 0}, {}), T0)
    assert not quiet_delta(counted, engines({"consecutiveFailures": 2}, {}), T0)
    assert not quiet_delta(stored, {**engines({}, {}), "phase": "Running"}, T0)
    assert not quiet_delta(stored, engines({}), T0)  # a cell fewer


def test_a_pending_cells_pods_and_endpoint_wait_for_its_next_change_but_not_for_long():
    from rljob_operator.reconcile.job_status import PENDING_QUIET_SECONDS

    born = iso(T0)
    pending = {"name": "j-cell-0", "state": "Pending", "generation": 0, "pods": [], "lastTransitionTime": born}
    stored = {"engines": [pending]}
    made = {**pending, "pods": ["j-cell-0-g0-0"]}
    placed = {**made, "endpoint": "http://10.0.0.1:8000"}
    assert quiet_delta(stored, {"engines": [made]}, T0 + 1)
    assert quiet_delta(stored, {"engines": [placed]}, T0 + PENDING_QUIET_SECONDS - 1)
    # still Pending after that: stuck (unschedulable, a quota), so `kubectl describe` names its pods
    assert not quiet_delta(stored, {"engines": [made]}, T0 + PENDING_QUIET_SECONDS)
    # the cell starts: written at once, with its pods and endpoint
    assert not quiet_delta(stored, {"engines": [{**placed, "state": "Starting"}]}, T0 + 1)
    # a serving cell's endpoint moving is news
    serving = {**placed, "state": "Serving"}
    assert not quiet_delta({"engines": [serving]}, {"engines": [{**serving, "endpoint": "http://10.0.0.2:8000"}]}, T0 + 1)
    # a Pending cell whose other fields move (a new generation) is news
    assert not quiet_delta(stored, {"engines": [{**made, "generation": 1}]}, T0 + 1)


def test_cells_coming_up_while_others_start_is_progress_that_may_wait_and_nothing_else_is():
    def step(stored: dict, *states: str, generation: int = 1) -> tuple[dict, dict]:
        status, _ = build_status(stored, Observed(now=T0 + 1, generation=generation, replicas=len(states),
                                                  controller=ctl(*states)))
        return status, status_delta(stored, status)

    stored, _ = build_status({}, Observed(now=T0, generation=1, replicas=3, controller=ctl("Pending", "Pending", "Pending")))
    status, delta = step(stored, "Serving", "Starting", "Pending")
    assert delta and startup_progress(stored, status, delta)
    assert not startup_progress({}, *step({}, "Serving", "Starting", "Pending")), "the job's first write"
    assert not startup_progress(stored, *step(stored, "Serving", "Serving", "Serving")), "the write that makes it Ready"
    assert not startup_progress(stored, *step(stored, "Serving", "Failed", "Pending")), "a cell that failed"
    assert not startup_progress(stored, *step(stored, "Serving", "PendingWeights", "Pending")), "a cell waiting for weights"
    assert not startup_progress(stored, *step(stored, "Starting", "Starting", "Pending")), "engines loading, none serving"
    status, delta = step(stored, "Serving", "Pending", "Pending", generation=2)
    assert not startup_progress(stored, status, delta), "a new generation observed"
    recreated = ctl("Serving", "Pending", "Pending")
    recreated["engines"][1]["restarts"] = 1
    status, _ = build_status(stored, Observed(now=T0 + 1, generation=1, replicas=3, controller=recreated))
    assert not startup_progress(stored, status, status_delta(stored, status)), "a cell recreated"
