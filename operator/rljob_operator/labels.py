"""Label and annotation keys the operator puts on its objects, and the selectors built from them.

Labels are the API between the operator's parts: the `<job>-engines` Service selects
`rljob.io/serving=true`, the Platform adapter finds a job's cells by `rljob.io/job` and
`rljob.io/role=engine`, and `kubectl get pods -l rljob.io/job=NAME` shows everything of one
job. Label values are limited to 63 characters, so long job and cell names go through
`label_value` (readable prefix + hash); the full names stay in annotations.
"""

from __future__ import annotations

from collections.abc import Mapping

from rljob_operator.kinds import GROUP, RAY_GROUP
from rljob_operator.names import dns_label

PREFIX = GROUP
JOB = f"{PREFIX}/job"
CELL = f"{PREFIX}/cell"
CELL_INDEX = f"{PREFIX}/cell-index"
GENERATION = f"{PREFIX}/generation"
POD_INDEX = f"{PREFIX}/pod-index"
ROLE = f"{PREFIX}/role"
SERVING = f"{PREFIX}/serving"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "rljob-operator"

# Annotations carrying the full (unshortened) names.
JOB_NAME_ANNOTATION = f"{PREFIX}/job-name"
CELL_NAME_ANNOTATION = f"{PREFIX}/cell-name"
# On the trainer Job: how many times the trainer gang was recreated before this Job (0: the first).
TRAINER_ATTEMPT_ANNOTATION = f"{PREFIX}/trainer-attempt"

ROLE_ENGINE = "engine"
ROLE_ROLLOUT = "rollout"
ROLE_TRAINER = "trainer"

# KubeRay's labels on a RayCluster's pods.
RAY_CLUSTER = f"{RAY_GROUP}/cluster"
RAY_NODE_TYPE = f"{RAY_GROUP}/node-type"

# Kueue's labels on the RLJob: the LocalQueue it is admitted through, its WorkloadPriorityClass.
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"

# Indexed Job pods carry their index in this annotation (Kubernetes >= 1.28 also as a label).
JOB_COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def label_value(text: str) -> str:
    """`text` if it is a valid label value of at most 63 characters, else a hashed short form."""
    return dns_label(text)


def job_labels(job: str, role: str) -> dict[str, str]:
    """Labels on every object of `role` for the job."""
    return {JOB: label_value(job), ROLE: role, MANAGED_BY: MANAGER}


def role_selector(job: str, role: str) -> dict[str, str]:
    """matchLabels selecting the job's pods of one role."""
    return {JOB: label_value(job), ROLE: role}


def engine_selector(job: str) -> dict[str, str]:
    return role_selector(job, ROLE_ENGINE)


def cell_selector(job: str, cell: str) -> dict[str, str]:
    """All pods of one cell, every generation."""
    return {**engine_selector(job), CELL: label_value(cell)}


def cell_head_selector(job: str, cell: str) -> dict[str, str]:
    """The head pod (pod 0) of one cell, every generation: the one that carries the serving label."""
    return {**cell_selector(job, cell), POD_INDEX: "0"}


def serving_selector(job: str) -> dict[str, str]:
    """The heads of serving cells: pod 0 of a cell is the one that serves HTTP.

    Only the head of a multi-node cell listens on the engine port (vLLM's Ray workers and
    SGLang's rank > 0 nodes serve no HTTP), so the Service adds pod-index=0 to the
    serving label, and only the head carries the label at all: `set_serving` is one PATCH per
    cell, not one per pod, which would be a large share of a ramp's writes.
    """
    return {**engine_selector(job), SERVING: "true", POD_INDEX: "0"}


def selector_string(labels: Mapping[str, str]) -> str:
    """matchLabels as a label-selector query string (`k=v,k=v`), sorted for determinism."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
