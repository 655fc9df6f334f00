"""The Kueue Workload an RLJob is admitted as: one PodSet per kind of pod. Pure.

Kueue admits a Workload as a whole, so the whole run (engine cells, executor, trainer ranks)
is one Workload, the way Kueue's own integrations turn a JobSet or a RayJob into one. Each
PodSet's template is the pod the operator will create (the engine builder's pod 0 of cell 0,
the executor Deployment's template, the trainer Job's template), so the requests Kueue
reserves quota for are the requests of the pods that run, GPUs included.

Counts: engines `replicas x pods per cell` (a 16-GPU engine on 8-GPU nodes is 2 pods), the
executor 1, with `spec.rollout.rayCluster` the RayCluster's head 1 and workers `workers`
(KubeRay creates those pods, but they run for this job and hold its quota), the trainer
`replicas` (only when the operator runs the trainer Job: a `workloadRef` trainer is the user's
and queues on its own). A PodSet of count 0 is left out (Kueue wants count >= 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller_runtime.ports import CellRequest
from rljob_operator.kinds import KUEUE_API_VERSION, WORKLOAD_KIND
from rljob_operator.manifests.engine import engine_pod
from rljob_operator.manifests.executor import executor_deployment
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.raycluster import ray_cluster
from rljob_operator.manifests.trainer import trainer_workload
from rljob_operator.names import (
    PODSET_ENGINES,
    PODSET_EXECUTOR,
    PODSET_RAY_HEAD,
    PODSET_RAY_WORKERS,
    PODSET_TRAINER,
    workload_name,
)


@dataclass(frozen=True)
class WorkloadPriority:
    """The priority Kueue orders and preempts by, and the class it came from."""

    value: int
    class_kind: str  # WorkloadPriorityClass or PriorityClass
    class_group: str  # kueue.x-k8s.io or scheduling.k8s.io
    class_name: str


def _template(pod_or_template: dict[str, Any]) -> dict[str, Any]:
    """A PodTemplateSpec: labels and annotations (Kueue matches nothing on them) and the spec."""
    meta = pod_or_template.get("metadata") or {}
    return {
        "metadata": {
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": pod_or_template["spec"],
    }


def pod_sets(job: dict[str, Any] | JobView, controller_url: str) -> list[dict[str, Any]]:
    """The Workload's PodSets, in a fixed order: engines, executor, Ray head and workers, trainer."""
    view = JobView.of(job)
    inf = view.spec.inference
    out: list[dict[str, Any]] = []
    engine_count = inf.replicas * inf.pods_per_cell
    if engine_count > 0:
        cell = CellRequest(name=f"{view.name}-cell-0", index=0, generation=0)
        out.append(
            {"name": PODSET_ENGINES, "count": engine_count, "template": _template(engine_pod(view, cell, 0))}
        )
    if view.spec.rollout is not None:
        executor = executor_deployment(view, controller_url)
        out.append({"name": PODSET_EXECUTOR, "count": 1, "template": _template(executor["spec"]["template"])})
    rc = ray_cluster(view)
    if rc is not None:
        head = rc["spec"]["headGroupSpec"]
        out.append({"name": PODSET_RAY_HEAD, "count": 1, "template": _template(head["template"])})
        for group in rc["spec"].get("workerGroupSpecs") or []:
            out.append({"name": PODSET_RAY_WORKERS, "count": int(group["replicas"]),
                        "template": _template(group["template"])})
    trainer = [o for o in trainer_workload(view, controller_url) if o["kind"] == "Job"]
    if trainer:
        count = int(trainer[0]["spec"]["parallelism"])
        out.append(
            {"name": PODSET_TRAINER, "count": count, "template": _template(trainer[0]["spec"]["template"])}
        )
    return out


def pod_set_counts(pod_sets_: list[dict[str, Any]]) -> dict[str, int]:
    """{PodSet name: count}: what a spec edit changes and a re-admission must follow."""
    return {str(p["name"]): int(p["count"]) for p in pod_sets_}


def workload(
    job: dict[str, Any] | JobView, queue: str, controller_url: str, priority: WorkloadPriority | None = None
) -> dict[str, Any]:
    """The Workload `rljob-<job>` in the job's namespace, owned by the RLJob (deleted with it)."""
    view = JobView.of(job)
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets(view, controller_url)}
    if priority is not None:
        spec["priority"] = priority.value
        spec["priorityClassRef"] = {
            "group": priority.class_group,
            "kind": priority.class_kind,
            "name": priority.class_name,
        }
    meta = view.metadata(workload_name(view.name), "workload")
    return {"apiVersion": KUEUE_API_VERSION, "kind": WORKLOAD_KIND, "metadata": meta, "spec": spec}
