"""A trainer rank SIGKILLed mid-run: the operator recreates every trainer pod and they resume.

Real parts: the operator process, kube-apiserver and kube-controller-manager's Job controller
(which fails the Indexed Job at the first failed rank and stops the other pods), the test
cluster's agent running each trainer pod as a local process, a 2-rank gloo group and the real
checkpoint store (tests/integration/trainer_gang.py). The engines are stand-ins: this is about
the trainer's life cycle, the reference trainer's own resume is in test_trainer_resume.py.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from rljob_client.trainer.checkpoint import CheckpointStore

from tests.integration.operator_harness import (
    PID_ANNOTATION,
    PROCESS_LABEL,
    REPO,
    Kube,
    OperatorProcess,
    condition,
    free_port,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)
from tests.integration.trainer_gang import expected_weights

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

PYTHON = str(REPO / ".venv" / "bin" / "python")
STEPS, SAVE_EVERY, KILL_AFTER = (
    6,
    2,
    5,
)  # the kill comes after step 4: newest checkpoint step-4, step 4 unsaved


@pytest.fixture
def kube(cluster, namespace) -> Kube:
    install_crd(cluster)
    cluster.kubectl("create", "serviceaccount", "rljob-trainer", "-n", namespace)  # the example's trainer SA
    return Kube(cluster, namespace)


@pytest.fixture
def operator(kube: Kube, namespace: str, tmp_path: Path):
    op = OperatorProcess(kube.cluster, namespace, tmp_path)
    yield op
    op.stop()
    release_rljobs(kube.cluster, namespace)


def gang_job(
    name: str, command: list[str], env: dict[str, str], *, replicas: int, max_restarts: int
) -> dict[str, Any]:
    job = make_rljob(name, replicas=1, trainer_job=True)
    job["spec"]["trainer"].update(
        replicas=replicas,
        maxRestarts=max_restarts,
        command=command,
        # The test cluster has no DNS for <job>-trainer-0.<job>-trainer: rank 0's store on loopback.
        env=[
            {"name": k, "value": v}
            for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env}.items()
        ],
        podMetadata={"labels": {PROCESS_LABEL: "process"}},  # real processes: kwok would complete the pods
    )
    return job


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trainer_job(kube: Kube, name: str) -> dict[str, Any] | None:
    tj = kube.get("job", f"{name}-trainer")
    return None if not tj or tj["metadata"].get("deletionTimestamp") else tj


def running_rank_pids(kube: Kube, name: str, uid: str) -> dict[int, int] | None:
    pods = kube.pods(f"batch.kubernetes.io/controller-uid={uid}")
    pids = {
        int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]): int(
            p["metadata"]["annotations"][PID_ANNOTATION]
        )
        for p in pods
        if PID_ANNOTATION in p["metadata"].get("annotations", {}) and p["status"].get("phase") == "Running"
    }
    return pids if len(pids) == 2 else None


def test_a_rank_killed_mid_run_restarts_every_rank_from_the_last_checkpoint(
    kube: Kube, operator, tmp_path: Path
):
    out = tmp_path / "gang"
    out.mkdir()
    (out / "gate").write_text(str(KILL_AFTER))
    kube.apply(
        gang_job(
            "gang",
            [PYTHON, "-m", "tests.integration.trainer_gang"],
            {"OUT_DIR": str(out), "STEPS": str(STEPS), "SAVE_EVERY": str(SAVE_EVERY)},
            replicas=2,
            max_restarts=2,
        )
    )
    steps_file, store = out / "steps.jsonl", CheckpointStore(out / "checkpoints")

    first = wait_for(lambda: trainer_job(kube, "gang"), 90, what="trainer Job created")
    assert first["metadata"]["annotations"]["rljob.io/trainer-attempt"] == "0"
    pids = wait_for(
        lambda: running_rank_pids(kube, "gang", first["metadata"]["uid"]), 120, what="both ranks running"
    )
    wait_for(
        lambda: len(jsonl(steps_file)) == 2 * KILL_AFTER and 4 in store.steps(),
        120,
        what=f"steps 0..{KILL_AFTER - 1} trained by both ranks and checkpoint step-4 saved",
    )
    os.kill(pids[1], signal.SIGKILL)  # rank 1, mid-run: step 4 is trained but not in a checkpoint

    second = wait_for(
        lambda: (
            (tj := trainer_job(kube, "gang")) and tj["metadata"]["uid"] != first["metadata"]["uid"] and tj
        ),
        120,
        what="the trainer Job recreated",
    )
    assert second["metadata"]["annotations"]["rljob.io/trainer-attempt"] == "1"
    new_pids = wait_for(
        lambda: running_rank_pids(kube, "gang", second["metadata"]["uid"]), 120, what="both ranks back"
    )
    assert not set(new_pids.values()) & set(pids.values())  # every rank restarted, the survivor too
    wait_for(
        lambda: len(jsonl(steps_file)) == 2 * (KILL_AFTER + 1), 120, what="step 4 trained again by both ranks"
    )
    (out / "gate").write_text(str(STEPS))
    wait_for(
        lambda: kube.status("gang").get("phase") == "Succeeded",
        180,
        what="Succeeded once the second attempt completes",
    )

    status = kube.status("gang")
    assert status["trainerRestarts"] == 1 and condition(status, "Failed")["status"] == "False"
    events = [e for e in kube.events("gang") if e.get("reason") == "TrainerRestarted"]
    assert (
        len(events) == 1
        and "failed rank: 1" in events[0]["message"]
        and "restart 1 of 2" in events[0]["message"]
    )
    # Steps 0..3 (in the checkpoint) were trained once per rank; the second attempt began at step 4 on both.
    log = jsonl(steps_file)
    restarted = [r for r in log if r["pid"] in new_pids.values()]
    assert sorted((r["rank"], r["step"]) for r in log if r["pid"] in pids.values()) == [
        (rank, step) for rank in (0, 1) for step in range(KILL_AFTER)
    ]
    assert sorted((r["rank"], r["step"]) for r in restarted) == [
        (rank, step) for rank in (0, 1) for step in range(4, STEPS)
    ]
    # The resumed run ends exactly where a run that never stopped ends: weights, Adam moments and
    # each rank's own input stream (its RNG) all came back from the checkpoint.
    final = store.load(STEPS)
    want = expected_weights(STEPS, world_size=2)
    assert set(final.model) == set(want)
    for key, tensor in want.items():
        torch.testing.assert_close(final.model[key], tensor, rtol=0, atol=1e-6)


def test_a_trainer_that_keeps_failing_spends_its_restart_budget_and_fails_the_job(kube: Kube, operator):
    kube.apply(gang_job("crashy", [PYTHON, "-c", "import sys; sys.exit(3)"], {}, replicas=1, max_restarts=1))
    wait_for(lambda: kube.status("crashy").get("phase") == "Failed", 180, what="Failed after one restart")
    status = kube.status("crashy")
    failed = condition(status, "Failed")
    assert status["trainerRestarts"] == 1
    assert failed["reason"] == "TrainerRestartBudgetExhausted"
    assert (
        "failed rank: 0" in failed["message"]
        and "spec.trainer.maxRestarts (1) restarts spent" in failed["message"]
    )
    assert trainer_job(kube, "crashy")["metadata"]["annotations"]["rljob.io/trainer-attempt"] == "1"
