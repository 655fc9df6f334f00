"""`spec.rollout.rayCluster` reconciled by the real KubeRay operator, used as the executor's Ray.

On the pod-network test cluster (real Service DNS and kube-proxy): the operator, `helm
install`ed in-cluster, makes the RayCluster; KubeRay v1.5.0 (built from its Go module, run by
the `kuberay` fixture) reconciles it into a head pod whose command is KubeRay's own generated
`ray start --head ... --block`, which the test cluster's agent runs as a real process in the
pod's network namespace (the pods carry the process label through `spec.rollout.podMetadata`).
The executor Deployment connects to it as a Ray Client driver through
`ray://<job>-rollout:10001` (the Service selects KubeRay's head pod) and creates its actor
there; the user's own trainer (a Job named by `workloadRef`) fetches a batch the same way.

The engine is the light stand-in (tests/engine_standin): the point here is the KubeRay path,
not generation.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.cluster.fixtures import Cluster
from tests.e2e.conftest import PROCESS_LABEL, control_service_account, kjson, venv_path_env

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cluster.yaml"
STANDIN_DIR = REPO / "tests" / "engine_standin"
JOB = "kr-loop"
TRAINER_SA = f"{JOB}-trainer"
BATCH, SAMPLES = 2, 2

# The user's trainer: one rank that streams rollout 0 the way the reference trainer does.
TRAINER = textwrap.dedent(f"""
    import json
    from urllib.parse import urlsplit
    from rljob_client.rollout_stream import RolloutStream
    with RolloutStream({JOB!r}, connect_timeout_s=240) as stream:  # KubeRay's head is starting
        batch = stream.get(0, 0, 1)
        print("RESULT " + json.dumps({{
            "address": stream.address, "transport": stream.transport, "rows": len(batch),
            "rollout_id": batch.rollout_id, "data_host": urlsplit(stream._info["data_url"]).hostname,
        }}), flush=True)
""")


def rljob(tmp: Path) -> dict[str, Any]:
    """examples/tiny-cluster.yaml with a stand-in engine, the rollout's Ray on a RayCluster and
    the user's own trainer Job (workloadRef)."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = JOB
    spec = job["spec"]
    spec["model"] = {"path": str(tmp / "model")}  # the stand-in loads nothing
    inf = spec["inference"]
    inf["env"] = [
        {"name": "PYTHONPATH", "value": str(STANDIN_DIR)},
        {"name": "RLJOB_STANDIN_CELLS", "value": "all"},
    ]
    inf["weightUpdate"]["sharedPath"] = str(tmp / "weights")
    ro = spec["rollout"]
    ro["rayCluster"] = {"workers": 0}
    ro["dataset"]["path"] = str(REPO / "examples" / "data" / "tiny-prompts.jsonl")
    ro["sampling"].update(nSamplesPerPrompt=SAMPLES, maxTokens=4)
    ro["reward"]["args"] = {"size": 10, "seed": 0, "vocab_size": 1000}  # no model dir to read it from
    ro["batchSize"] = BATCH
    spec["trainer"] = {
        "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": f"{JOB}-my-trainer"},
        "serviceAccountName": TRAINER_SA,  # the executor runs as it too (engine discovery)
    }
    spec.pop("ttlSecondsAfterFinished", None)
    return job


def trainer_job(ns: str) -> dict[str, Any]:
    auth = {"secretKeyRef": {"name": f"{JOB}-ray-auth", "key": "token"}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{JOB}-my-trainer", "namespace": ns},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {PROCESS_LABEL: "process"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "trainer",
                        "image": "ignored.invalid/trainer:0",
                        "command": [sys.executable, "-c", TRAINER],
                        "env": [venv_path_env(), {"name": "RAY_AUTH_MODE", "value": "token"},
                                {"name": "RAY_AUTH_TOKEN", "valueFrom": auth}],
                    }],
                },
            },
        },
    }  # fmt: skip


def logs(c: Cluster, ns: str) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in (c.cache / "logs").glob(f"{ns}_*.log")}


def dump(c: Cluster, ns: str, kuberay: Any) -> str:
    parts = [f"== {k}\n{v[-2500:]}" for k, v in logs(c, ns).items()]
    parts.append(c.kubectl("-n", ns, "get", "rlj,raycluster,pods,svc,jobs", "-o", "wide", check=False).stdout)
    return "\n".join([*parts, f"== kuberay\n{kuberay.log_tail(40)}"])


@pytest.mark.timeout(420)
def test_kuberay_runs_the_rollout_ray_and_a_trainer_streams_a_batch(
    podnet_cluster, loop_ns, kuberay, tmp_path
):
    c = podnet_cluster
    ns, release = loop_ns
    control_service_account(c, ns, release, TRAINER_SA)
    c.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(rljob(tmp_path)))
    # The user's trainer starts with the job, as it would: it waits for the rollout's Ray itself
    # (once the operator made the Ray token Secret its env refers to).
    c.wait_for(
        lambda: c.kubectl("-n", ns, "get", "secret", f"{JOB}-ray-auth", check=False).returncode == 0,
        timeout=60,
        what="the job's Ray token Secret",
    )
    c.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(trainer_job(ns)))

    # The operator's RayCluster, reconciled by KubeRay into a head pod of KubeRay's making.
    rc = c.wait_for(lambda: kjson(c, ns, "raycluster", f"{JOB}-ray"), timeout=60, what="RayCluster")
    (owner,) = rc["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("RLJob", JOB, True)
    head_selector = f"ray.io/cluster={JOB}-ray,ray.io/node-type=head"
    head = c.wait_for(
        lambda: next(iter(kjson(c, ns, "pods", "-l", head_selector)["items"]), None),
        timeout=60,
        what="KubeRay's head pod",
    )
    assert head["metadata"]["labels"]["app.kubernetes.io/created-by"] == "kuberay-operator"
    assert head["metadata"]["labels"][PROCESS_LABEL] == "process"  # spec.rollout.podMetadata
    (head_owner,) = head["metadata"]["ownerReferences"]
    assert (head_owner["kind"], head_owner["name"]) == ("RayCluster", f"{JOB}-ray")
    ray_container = head["spec"]["containers"][0]
    started = " ".join(ray_container["command"] + ray_container.get("args", []))
    assert "ray start --head" in started and "--block" in started, started  # KubeRay generated it
    assert "--disable-usage-stats" in started, started

    # The trainer reached the rollout through ray://<job>-rollout:10001 (Service DNS to KubeRay's
    # head) and got rollout 0's batch.
    c.wait_for(
        lambda: (
            (kjson(c, ns, "job", f"{JOB}-my-trainer").get("status") or {}).keys() & {"succeeded", "failed"}
        ),
        timeout=300,
        interval=1,
        what="trainer Job finished",
    )
    status = kjson(c, ns, "job", f"{JOB}-my-trainer")["status"]
    assert status.get("succeeded") == 1, dump(c, ns, kuberay)
    (trainer_log,) = [v for k, v in logs(c, ns).items() if k.startswith(f"{ns}_{JOB}-my-trainer-")]
    result = json.loads(
        next(x for x in trainer_log.splitlines() if x.startswith("RESULT "))[len("RESULT ") :]
    )
    assert result["address"] == f"ray://{JOB}-rollout:10001"
    assert result["rollout_id"] == 0 and result["rows"] == BATCH * SAMPLES, result
    assert result["transport"] == "http"  # Ray Client: the bytes come over the actor's side channel

    # The actor serves from KubeRay's head pod (its address), not from the executor pod: the
    # executor was a Ray Client driver of KubeRay's Ray.
    head = kjson(c, ns, "pod", head["metadata"]["name"])
    assert result["data_host"] == head["status"]["podIP"], (result, head["status"])
    # One executor pod: it waited for KubeRay's head (rljob_client.rayconnect) instead of
    # crashing while the head started and being replaced by its ReplicaSet, once per attempt.
    executor_logs = [v for k, v in logs(c, ns).items() if k.startswith(f"{ns}_{JOB}-rollout-")]
    assert len(executor_logs) == 1, "\n".join(x[-1500:] for x in executor_logs)
    (executor_log,) = executor_logs
    ready = json.loads(next(x for x in executor_log.splitlines() if x.startswith('{"event": "ready"')))
    assert ready["ray_address"] == f"ray://{JOB}-rollout:10001" and ready["client_address"] is None
    assert urlsplit(ready["data_url"]).hostname == head["status"]["podIP"]
    assert kjson(c, ns, "raycluster", f"{JOB}-ray")["status"]["state"] == "ready"
