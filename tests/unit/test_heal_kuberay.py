"""The pure parts of bench/heal_kuberay.py (the KubeRay side of heal_bench, off in its smoke mode
because KubeRay's start alone costs ~20 s here): the RayCluster it makes, and how a kill trial's
moments are read from what the watches saw."""

from __future__ import annotations

from bench.heal_kuberay import KillTrial, PodSeen, heal_raycluster, resolve
from tests.integration.operator_harness import PROCESS_LABEL


def test_the_workers_are_stand_in_processes_kuberay_keeps_and_never_restarts_in_place() -> None:
    rc = heal_raycluster("r", 3)
    assert rc["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    tpl = group["template"]
    assert tpl["metadata"]["labels"][PROCESS_LABEL] == "process"
    assert tpl["spec"]["restartPolicy"] == "Never"
    assert "rljob_engine_standin.py" in " ".join(tpl["spec"]["containers"][0]["command"])
    assert PROCESS_LABEL not in (rc["spec"]["headGroupSpec"]["template"].get("metadata") or {}).get("labels", {})


def pod(t: float, kind: str, name: str, phase: str = "Running", deleting: bool = False) -> PodSeen:
    return PodSeen(t, kind, name, phase, deleting, "127.1.0.1", "42")


def test_a_kill_trial_takes_each_moment_once_from_the_killed_pod_and_its_replacement() -> None:
    trial = KillTrial("w-a", at=10.0)
    pods = [
        pod(9.0, "MODIFIED", "w-a", "Failed"),  # before the signal: not this trial's
        pod(10.1, "MODIFIED", "w-a", "Failed"),
        pod(10.2, "MODIFIED", "w-a", "Failed", deleting=True),
        pod(10.25, "MODIFIED", "w-b"),  # a worker that was there before
        pod(10.3, "ADDED", "w-c", "Pending"),
        pod(10.35, "MODIFIED", "w-c", "Running"),
        pod(10.4, "DELETED", "w-a", "Failed", deleting=True),
        pod(10.5, "ADDED", "w-d", "Running"),  # a second new pod is not the replacement
    ]
    ready = [(9.5, 2), (10.15, 1), (10.36, 2)]
    events = [(10.21, "DeletedWorkerPod", "Deleted worker Pod ns/w-a; Pod status: Failed"), (10.4, "CreatedWorkerPod", "w-c")]
    resolve(trial, {"w-a", "w-b"}, 2, pods, ready, events)
    assert trial.replacement == "w-c"
    assert trial.seconds() == {"pod_failed": 0.1, "kuberay_deletes": 0.2, "event": 0.21, "status_degraded": 0.15,
                               "pod_created": 0.3, "running": 0.35, "serving": None, "status_ready": 0.36}  # fmt: skip
