"""A trainer the user runs (`spec.trainer.workloadRef`) ends the RLJob, against the real test cluster.

Real parts: the operator process, kube-apiserver, kube-controller-manager's Job controller (which
sets the Job's Complete/Failed conditions from its pods), and the cluster's agent running the
Job's pod as a local process that exits 0 or 3. The engines are stand-ins. The referenced Job
carries the labels the job's NetworkPolicies admit a trainer by (docs/design.md). A kind the
CRD refuses is tested with the other admission rules (tests/unit/crd_cases.py, run against the
real API server by test_crd_apiserver.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.operator_harness import (
    PROCESS_LABEL,
    Kube,
    OperatorProcess,
    condition,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture
def kube(cluster, namespace) -> Kube:
    install_crd(cluster)
    cluster.kubectl("create", "serviceaccount", "rljob-trainer", "-n", namespace)  # the example's trainer SA
    return Kube(cluster, namespace)


@pytest.fixture
def operator(kube: Kube, namespace: str, tmp_path):
    op = OperatorProcess(kube.cluster, namespace, tmp_path)
    yield op
    op.stop()
    release_rljobs(kube.cluster, namespace)


def user_job(name: str, job: str, exit_code: int) -> dict[str, Any]:
    """A batch/v1 Job as a user writes it: one pod, a real process that exits `exit_code`."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {PROCESS_LABEL: "process", "rljob.io/job": job, "rljob.io/role": "trainer"}},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": "rljob-trainer",
                    "containers": [{
                        "name": "trainer",
                        "image": "my-trainer:1",
                        "command": ["python", "-c", f"import sys; print('trained'); sys.exit({exit_code})"],
                    }],
                },
            },
        },
    }  # fmt: skip


def phase(kube: Kube, name: str) -> str:
    return str(kube.status(name).get("phase") or "")


def test_a_referenced_job_that_completes_makes_the_rljob_succeed_and_frees_the_engines(kube, operator):
    kube.apply(make_rljob("done", replicas=1))
    wait_for(lambda: phase(kube, "done") == "Running", 90, what="RLJob done Running")
    status = kube.status("done")
    workload = condition(status, "TrainerWorkload")
    assert (workload["status"], workload["reason"]) == ("False", "TrainerWorkloadMissing")
    assert "batch/v1 Job done-my-trainer does not exist" in workload["message"]
    assert phase(kube, "done") == "Running", "a missing trainer is said, not a failure"

    kube.apply(user_job("done-my-trainer", "done", 0))
    wait_for(lambda: phase(kube, "done") == "Succeeded", 120, what="RLJob done Succeeded")
    status = kube.status("done")
    assert condition(status, "TrainerWorkload")["reason"] == "Succeeded"
    assert condition(status, "Failed")["status"] == "False"
    wait_for(lambda: kube.engine_pods("done") == [], 60, what="engine pods of a finished job deleted")
    described = kube.cluster.kubectl("describe", "rlj", "done", "-n", kube.ns).stdout
    assert "TrainerWorkloadMissing" in described  # the Event of the missing workload


def test_a_referenced_job_that_fails_makes_the_rljob_fail_with_its_message(kube, operator):
    kube.apply(user_job("broke-my-trainer", "broke", 3))
    kube.apply(make_rljob("broke", replicas=1))
    wait_for(lambda: phase(kube, "broke") == "Failed", 120, what="RLJob broke Failed")
    failed = condition(kube.status("broke"), "Failed")
    assert failed["reason"] == "TrainerWorkloadFailed"
    assert failed["message"].startswith("batch/v1 Job broke-my-trainer failed: BackoffLimitExceeded")
    wait_for(lambda: kube.engine_pods("broke") == [], 60, what="engine pods of a failed job deleted")


def test_a_reference_to_a_kind_whose_crd_is_absent_is_a_condition_and_the_operator_goes_on(kube, operator):
    """The test cluster serves no PyTorchJob: the job says so and keeps its engines; the operator
    still runs (its other jobs are served) and follows a batch/v1 Job referenced afterwards."""
    job = make_rljob("nokind", replicas=1)
    job["spec"]["trainer"]["workloadRef"] = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "pt"}
    kube.apply(job)
    wait_for(lambda: condition(kube.status("nokind"), "TrainerWorkload").get("reason") == "TrainerWorkloadKindNotServed",
             90, what="TrainerWorkloadKindNotServed")  # fmt: skip
    assert "pytorchjobs.kubeflow.org/v1" in condition(kube.status("nokind"), "TrainerWorkload")["message"]
    kube.apply(user_job("next-my-trainer", "next", 0))
    kube.apply(make_rljob("next", replicas=1))
    wait_for(lambda: phase(kube, "next") == "Succeeded", 120, what="RLJob next Succeeded")
    assert operator.healthz() is not None

