"""The pods the operator makes pass the Pod Security Standard `restricted`, checked by the real
kube-apiserver's PodSecurity admission in a namespace labelled to enforce it.

Fault: a namespace whose admins enforce `restricted`. Expectation: the executor, trainer and
KubeRay pods the operator would create there are admitted (server-side dry run of each pod
template as a Pod); an engine pod is refused with the violations named, which shows that the
namespace does enforce and documents what GPU engines keep (docs/design.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rljob_operator.manifests import engine_pods, executor_deployment, ray_cluster, trainer_workload

from controller_runtime.ports import CellRequest
from tests.unit.test_manifests_golden import CONTROLLER_URL, load_job

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def as_pod(name: str, namespace: str, pod_spec: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def job_in(case: str, namespace: str) -> dict[str, Any]:
    job = load_job(case)
    job["metadata"]["namespace"] = namespace
    return job


def operator_pods(namespace: str) -> list[dict[str, Any]]:
    """A pod of each kind that the operator makes and that runs no engine."""
    job = job_in("llama-8b-8gpu", namespace)
    deployment = executor_deployment(job, CONTROLLER_URL)
    trainer = next(o for o in trainer_workload(job, CONTROLLER_URL) if o["kind"] == "Job")
    rc = ray_cluster(job_in("multinode-vllm", namespace))
    assert rc is not None
    templates = {
        "executor": deployment["spec"]["template"],
        "trainer": trainer["spec"]["template"],
        "ray-head": rc["spec"]["headGroupSpec"]["template"],
        "ray-worker": rc["spec"]["workerGroupSpecs"][0]["template"],
    }
    return [as_pod(f"psa-{k}", namespace, t["spec"], t["metadata"]["labels"]) for k, t in templates.items()]


def dry_run(cluster: Any, obj: dict[str, Any]) -> tuple[int, str]:
    out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
    return out.returncode, out.stdout + out.stderr


def test_restricted_namespace_admits_executor_trainer_and_ray_pods_and_refuses_an_engine(cluster, namespace):
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "rljob-trainer")  # the example's trainer SA
    for pod in operator_pods(namespace):
        code, out = dry_run(cluster, pod)
        assert code == 0 and "PodSecurity" not in out, f"{pod['metadata']['name']} refused: {out}"

    engine = engine_pods(
        job_in("llama-8b-8gpu", namespace), CellRequest(name="llama-8b-grpo-cell-0", index=0, generation=1)
    )[0]
    code, out = dry_run(cluster, engine)
    assert code != 0 and 'violates PodSecurity "restricted:latest"' in out, out
    assert "allowPrivilegeEscalation" in out and "runAsNonRoot" in out
