"""Per-role pod templates (`spec.<role>.template`) and what in them the operator owns.

A template is a PodTemplateSpec merged with the pod the operator builds (the merge is in
`rljob_operator.manifests.template`): containers by name, the role's main container by the
name in `MAIN_CONTAINERS`. Where the operator's value is load-bearing (its command and
ports, its probes, the GPU count, the restart policy and DNS names rendezvous relies on) a
template that sets it is refused, by a CEL rule at admission and by the same check in
pydantic for local mode, with a message that names the field and says what to set instead.
One table (`OWNED`) produces both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from controller_runtime.api.base import ApiModel

# The key that tells the CRD generator to embed a vendored Kubernetes schema (by root name).
K8S_SCHEMA = "x-rljob-k8s-schema"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
GPU_RESOURCE_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
OPERATOR_LABEL_PREFIX = "rljob.io/"

# The operator's init containers (downloads of spec.model.uri and spec.rollout.dataset.uri).
FETCH_MODEL_CONTAINER = "fetch-model"
FETCH_DATASET_CONTAINER = "fetch-dataset"
ENGINE_CONTAINER = "engine"
EXECUTOR_CONTAINER = "executor"
TRAINER_CONTAINER = "trainer"


class PodTemplateMetadata(ApiModel):
    """Labels and annotations added to the role's pods."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=64, description="Extra labels on the pods (keys under rljob.io/ are the operator's).")
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64, description="Extra annotations on the pods.")


class PodTemplate(ApiModel):
    """A PodTemplateSpec merged into the pods the operator builds for this role.

    Containers are matched by name (the role's main container is `engine`, `executor` or
    `trainer`); env is merged by name, volumes and imagePullSecrets by name, ports by
    containerPort, volumeMounts by mountPath, tolerations appended, maps merged; any other
    field set here replaces the operator's default. Fields the operator owns are refused.
    """

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata, description="Labels and annotations of the pods.")
    spec: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra={K8S_SCHEMA: "PodSpec", "type": "object"},
        description="A Kubernetes PodSpec (core/v1); `containers` may hold only the fields to add to the main container.",
    )


@dataclass(frozen=True)
class OwnedFields:
    """What the operator sets in one role's pods and a template may not."""

    role: str  # spec.<role>
    container: str  # the main container's name
    pod: dict[str, str]  # PodSpec field -> why it is the operator's
    main: dict[str, str]  # main container field -> what to set instead
    gpus: str | None  # where the GPU count comes from, None for a role without GPUs


OWNED = {
    "inference": OwnedFields(
        role="inference",
        container=ENGINE_CONTAINER,
        pod={
            "restartPolicy": "a cell is restarted whole by the operator (Never)",
            "hostname": "multi-node cells reach pod 0 by its DNS name",
            "subdomain": "multi-node cells reach pod 0 through the <job>-cells Service",
        },
        main={
            "image": "set spec.inference.image",
            "command": "set spec.inference.engineArgs",
            "args": "set spec.inference.engineArgs",
            "ports": "set spec.inference.port",
            "readinessProbe": "the operator probes /health; tune spec.inference.healthCheck",
            "livenessProbe": "engine health is the operator's probe (spec.inference.healthCheck)",
            "startupProbe": "set spec.inference.healthCheck.startupDeadlineSeconds",
        },
        gpus="spec.inference.gpusPerEngine",
    ),
    "rollout": OwnedFields(
        role="rollout",
        container=EXECUTOR_CONTAINER,
        pod={"restartPolicy": "the executor is a Deployment (Always)"},
        main={
            "image": "set spec.rollout.image",
            "command": "the executor's command comes from spec.rollout",
            "args": "the executor's command comes from spec.rollout",
            "ports": "the executor's ports are fixed (Ray Client, dashboard, GCS, shard data)",
            "readinessProbe": "the operator probes the Ray Client port",
        },
        gpus=None,
    ),
    "trainer": OwnedFields(
        role="trainer",
        container=TRAINER_CONTAINER,
        pod={
            "restartPolicy": "failed ranks are restarted by the operator (Never)",
            "subdomain": "ranks find rank 0 through the <job>-trainer Service",
        },
        main={
            "image": "set spec.trainer.image",
            "command": "set spec.trainer.command",
            "args": "set spec.trainer.args",
            "ports": "the rendezvous port is fixed (MASTER_PORT)",
        },
        gpus="spec.trainer.gpusPerReplica",
    ),
}


def pod_field_message(owned: OwnedFields, field: str) -> str:
    return f"spec.{owned.role}.template.spec.{field} is set by the operator ({owned.pod[field]}); remove it"


def main_field_message(owned: OwnedFields, field: str) -> str:
    return (
        f"spec.{owned.role}.template.spec.containers[name={owned.container}].{field} is set by the operator: "
        f"{owned.main[field]}"
    )


def gpu_message(owned: OwnedFields) -> str:
    return (
        f"spec.{owned.role}.template.spec.containers[name={owned.container}].resources must not set "
        f"spec.{owned.role}.gpuResource: the GPU count comes from {owned.gpus}"
    )


def init_message(owned: OwnedFields) -> str:
    return (
        f"spec.{owned.role}.template.spec.initContainers named {FETCH_MODEL_CONTAINER} or {FETCH_DATASET_CONTAINER} "
        "are the operator's (they download spec.model.uri and spec.rollout.dataset.uri); use another name"
    )


def label_message(owned: OwnedFields) -> str:
    return f"spec.{owned.role}.template.metadata.labels under {OPERATOR_LABEL_PREFIX} are the operator's; use another prefix"


def _main(owned: OwnedFields, test: str) -> str:
    """CEL: every container named like the main one passes `test` (over `c`)."""
    return (
        "!has(self.template) || !has(self.template.spec) || !has(self.template.spec.containers) "
        "|| self.template.spec.containers.all(c, "
        f"c.name != '{owned.container}' || ({test}))"
    )


def cel_rules(owned: OwnedFields) -> list[dict[str, str]]:
    """The CEL rules of one role's spec object (self = spec.<role>)."""
    rules = [
        {
            "rule": f"!has(self.template) || !has(self.template.spec) || !has(self.template.spec.{field})",
            "message": pod_field_message(owned, field),
            "fieldPath": f".template.spec.{field}",
        }
        for field in owned.pod
    ]
    rules += [
        {"rule": _main(owned, f"!has(c.{field})"), "message": main_field_message(owned, field), "fieldPath": ".template.spec.containers"}
        for field in owned.main
    ]
    if owned.gpus is not None:
        no_gpu = (
            "!has(c.resources) || ((!has(c.resources.limits) || !(self.gpuResource in c.resources.limits))"
            " && (!has(c.resources.requests) || !(self.gpuResource in c.resources.requests)))"
        )
        rules.append({"rule": _main(owned, no_gpu), "message": gpu_message(owned), "fieldPath": ".template.spec.containers"})
    rules.append({
        "rule": (
            "!has(self.template) || !has(self.template.spec) || !has(self.template.spec.initContainers)"
            f" || self.template.spec.initContainers.all(c, c.name != '{FETCH_MODEL_CONTAINER}'"
            f" && c.name != '{FETCH_DATASET_CONTAINER}')"
        ),
        "message": init_message(owned),
        "fieldPath": ".template.spec.initContainers",
    })
    rules.append({
        "rule": (
            "!has(self.template) || !has(self.template.metadata) || !has(self.template.metadata.labels)"
            f" || !self.template.metadata.labels.exists(k, k.startsWith('{OPERATOR_LABEL_PREFIX}'))"
        ),
        "message": label_message(owned),
        "fieldPath": ".template.metadata.labels",
    })
    return rules


def env_message(role: str) -> str:
    return f"spec.{role}.env: an entry sets both value and valueFrom; keep one"


def env_rule(role: str) -> dict[str, str]:
    """CEL on spec.<role>: no env entry has both a value and a valueFrom (the Pod API refuses it later)."""
    return {"rule": "!has(self.env) || self.env.all(e, !has(e.valueFrom) || size(e.value) == 0)", "message": env_message(role), "fieldPath": ".env"}


def env_conflict(role: str, env: list[Any]) -> str | None:
    """`env_rule` for local mode."""
    return env_message(role) if any(e.value_from is not None and e.value for e in env) else None


def template_conflict(owned: OwnedFields, template: PodTemplate | None, gpu_resource: str | None) -> str | None:
    """The first refusal `cel_rules` would give, for local mode (pydantic); None when the template is fine."""
    if template is None:
        return None
    for field in owned.pod:
        if field in template.spec:
            return pod_field_message(owned, field)
    mains = [c for c in template.spec.get("containers") or [] if isinstance(c, dict) and c.get("name") == owned.container]
    for field in owned.main:
        if any(field in c for c in mains):
            return main_field_message(owned, field)
    if owned.gpus is not None:
        for c in mains:
            res = c.get("resources") or {}
            if any(gpu_resource in (res.get(k) or {}) for k in ("limits", "requests")):
                return gpu_message(owned)
    inits = [c for c in template.spec.get("initContainers") or [] if isinstance(c, dict)]
    if any(c.get("name") in (FETCH_MODEL_CONTAINER, FETCH_DATASET_CONTAINER) for c in inits):
        return init_message(owned)
    if any(k.startswith(OPERATOR_LABEL_PREFIX) for k in template.metadata.labels):
        return label_message(owned)
    return None
