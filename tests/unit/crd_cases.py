"""Tables of impossible RLJob specs, shared by the CEL, pydantic and API-server tests.

Each case edits a valid manifest (the 8-GPU example) and names the field the error must
name and the message it must carry; the same table runs through cel-python
(tests/unit/test_cel_rules.py), pydantic (local mode) and a real kube-apiserver
(tests/integration/test_crd_apiserver.py), so the three cannot drift apart.
"""

from __future__ import annotations

import copy
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from controller_runtime.api import podtemplate as P
from controller_runtime.api import spec as S
from controller_runtime.api.workloads import UNSUPPORTED_WORKLOAD_MSG

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
BASE_EXAMPLE = REPO_ROOT / "examples" / "llama-8b-8gpu.yaml"
DELETE = object()


def load_manifest(path: Path = BASE_EXAMPLE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def edited(manifest: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    """A copy of the manifest with `{"spec.a.b": value}` edits applied (DELETE removes the key)."""
    out = copy.deepcopy(manifest)
    for dotted, value in edits.items():
        *parents, leaf = dotted.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Case:
    id: str
    edits: dict[str, Any]
    field: str  # the path the API server's error names, e.g. spec.inference.gpusPerEngine
    message: str
    old_edits: dict[str, Any] | None = field(default=None)  # for transition cases: the stored object

    def manifest(self) -> dict[str, Any]:
        return edited(load_manifest(), self.edits)

    def old_manifest(self) -> dict[str, Any]:
        return edited(load_manifest(), self.old_edits or {})


INVALID = [
    Case(
        "cell-not-whole-nodes",
        {"spec.inference.gpusPerEngine": 12, "spec.inference.gpusPerNode": 8, "spec.inference.tensorParallelSize": DELETE},
        "spec.inference.gpusPerEngine",
        S.cell_shape_message(12, 8),
    ),
    Case(
        "cell-not-whole-nodes-small-nodes",
        {"spec.inference.gpusPerEngine": 6, "spec.inference.gpusPerNode": 4, "spec.inference.tensorParallelSize": DELETE},
        "spec.inference.gpusPerEngine",
        "spec.inference.gpusPerEngine (6) must be a multiple of spec.inference.gpusPerNode (4) when it is larger, "
        "because a cell spans whole nodes; use 4 or 8",
    ),
    Case("model-without-source", {"spec.model": {"tokenizer": "/tok"}}, "spec.model", S.MODEL_SOURCE_MSG),
    Case("dataset-uri-beside-pvc", {"spec.rollout.dataset.uri": "hf://openai/gsm8k"}, "spec.rollout.dataset.uri",
         S.DATASET_URI_EXCLUSIVE_MSG),
    Case("model-uri-beside-pvc", {"spec.model.uri": "hf://Qwen/Qwen2.5-7B-Instruct"}, "spec.model.uri", S.MODEL_URI_EXCLUSIVE_MSG),
    Case(
        "offload-enabled-without-tags",
        {"spec.inference.offload": {"enabled": True, "tags": []}},
        "spec.inference.offload.tags",
        S.OFFLOAD_TAGS_MSG,
    ),
    Case(
        "trainer-workload-and-command",
        {
            "spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"},
            "spec.trainer.command": ["python", "train.py"],
        },
        "spec.trainer.workloadRef",
        S.TRAINER_EXCLUSIVE_MSG,
    ),
    Case("colocate", {"spec.trainer.colocate": True}, "spec.trainer.colocate", S.COLOCATE_REFUSED_MSG),
    Case(
        "colocate-with-offload",
        {"spec.trainer.colocate": True, "spec.inference.offload": {"enabled": True}},
        "spec.trainer.colocate",
        S.COLOCATE_REFUSED_MSG,
    ),
    Case(
        "trainer-workload-kind-not-followable",
        {"spec.trainer.workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "t"}},
        "spec.trainer.workloadRef",
        UNSUPPORTED_WORKLOAD_MSG,
    ),
    Case(
        "trainer-workload-kind-of-another-version",
        {"spec.trainer.workloadRef": {"apiVersion": "jobset.x-k8s.io/v1", "kind": "JobSet", "name": "t"}},
        "spec.trainer.workloadRef",
        UNSUPPORTED_WORKLOAD_MSG,
    ),
    Case(
        "grpo-group-of-one",
        {"spec.rollout.sampling.nSamplesPerPrompt": 1},
        "spec.rollout.sampling.nSamplesPerPrompt",
        S.GRPO_GROUP_MSG,
    ),
    Case(
        "tp-times-pp-not-gpus",
        {"spec.inference.tensorParallelSize": 2, "spec.inference.pipelineParallelSize": 2},
        "spec.inference.tensorParallelSize",
        S.TP_PP_PRODUCT_MSG,
    ),
    Case("tp-does-not-divide", {"spec.inference.tensorParallelSize": 4}, "spec.inference.tensorParallelSize", S.TP_DIVIDES_MSG),
    Case(
        "nccl-on-cpu",
        {"spec.inference.gpusPerEngine": 0, "spec.inference.weightUpdate.method": "nccl"},
        "spec.inference.weightUpdate.method",
        S.NCCL_NEEDS_GPUS_MSG,
    ),
    Case(
        "backoff-above-max",
        {"spec.inference.restartPolicy.backoffSeconds": 600},
        "spec.inference.restartPolicy.backoffSeconds",
        S.RESTART_BACKOFF_MSG,
    ),
    Case(
        "stale-samples-without-correction",  # the base example keeps maxStaleness: 1
        {"spec.trainer.reference.offPolicy": {"mode": "none"}},
        "spec.trainer.reference.offPolicy.mode",
        S.STALE_NEEDS_CORRECTION_MSG,
    ),
    Case(
        "save-every-spellings-disagree",  # the base example sets saveEverySteps: 50
        {"spec.trainer.reference.saveEvery": 10},
        "spec.trainer.reference.saveEvery",
        S.SAVE_EVERY_SPELLINGS_MSG,
    ),
    Case("no-rollout-with-reference-trainer", {"spec.rollout": DELETE}, "spec.rollout", S.ROLLOUT_NEEDED_MSG),
    Case(
        "no-rollout-with-trainer-command",
        {"spec.rollout": DELETE, "spec.trainer.command": ["python", "t.py"]},
        "spec.rollout",
        S.ROLLOUT_NEEDED_MSG,
    ),
    Case(
        "greedy-eval-with-several-samples",
        {"spec.rollout.eval": {"everySteps": 10, "samplesPerPrompt": 4}},
        "spec.rollout.eval.temperature",
        S.EVAL_SAMPLES_NEED_TEMPERATURE_MSG,
    ),
]

# A value for each field a template may not set (pod-level, then main container).
_OWNED_VALUES: dict[str, Any] = {
    "restartPolicy": "OnFailure", "hostname": "h", "subdomain": "s", "image": "me/mine:1", "command": ["sh"],
    "args": ["-c", "true"], "ports": [{"containerPort": 9000}], "readinessProbe": {"exec": {"command": ["true"]}},
    "livenessProbe": {"exec": {"command": ["true"]}}, "startupProbe": {"exec": {"command": ["true"]}},
}  # fmt: skip


def _template_cases() -> list[Case]:
    """One case per field `controller_runtime.api.podtemplate.OWNED` keeps for the operator."""
    out = []
    for role, owned in P.OWNED.items():
        at = f"spec.{role}.template"
        for name in owned.pod:
            out.append(Case(f"{role}-template-{name}", {at: {"spec": {name: _OWNED_VALUES[name]}}},
                            f"{at}.spec.{name}", P.pod_field_message(owned, name)))
        for name in owned.main:
            container = {"name": owned.container, name: _OWNED_VALUES[name]}
            out.append(Case(f"{role}-template-main-{name}", {at: {"spec": {"containers": [container]}}},
                            f"{at}.spec.containers", P.main_field_message(owned, name)))
        if owned.gpus is not None:
            container = {"name": owned.container, "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            out.append(Case(f"{role}-template-gpus", {at: {"spec": {"containers": [container]}}},
                            f"{at}.spec.containers", P.gpu_message(owned)))
        init = {"name": "fetch-model", "image": "me/mine:1"}
        out.append(Case(f"{role}-template-fetch-init", {at: {"spec": {"initContainers": [init]}}},
                        f"{at}.spec.initContainers", P.init_message(owned)))
        out.append(Case(f"{role}-template-operator-label", {at: {"metadata": {"labels": {"rljob.io/role": "x"}}}},
                        f"{at}.metadata.labels", P.label_message(owned)))
    for role in ("inference", "trainer"):
        both = [{"name": "HF_TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
        out.append(Case(f"{role}-env-value-and-value-from", {f"spec.{role}.env": both}, f"spec.{role}.env", P.env_message(role)))
    return out  # fmt: skip


INVALID += _template_cases()

# A template for every role that sets none of the operator's fields.
FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"example.com/owner": "me"}},
    "spec": {
        "imagePullSecrets": [{"name": "regcred"}],
        "schedulerName": "volcano",
        "hostIPC": True,
        "securityContext": {"runAsUser": 1000, "fsGroup": 1000},
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                    {"name": "cfg", "configMap": {"name": "my-config"}}],
        "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
        "containers": [{"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "inf"]}],
    },
}  # fmt: skip


def _with_main(template: dict[str, Any], container: str, gpu_resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    out = copy.deepcopy(template)
    out["spec"]["containers"].append({
        "name": container,
        "envFrom": [{"secretRef": {"name": "wandb"}}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True}],
        "resources": {"limits": {"rdma/ib": "1", "memory": "64Gi"}, "requests": {"memory": "64Gi"}},
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    })
    return out


# Variations near the rules that must stay valid.
VALID_EDITS = {
    "templates-of-every-role": {
        "spec.inference.template": _with_main(FULL_TEMPLATE, P.ENGINE_CONTAINER),
        "spec.rollout.template": _with_main(FULL_TEMPLATE, P.EXECUTOR_CONTAINER),
        "spec.trainer.template": _with_main(FULL_TEMPLATE, P.TRAINER_CONTAINER),
    },
    "amd-gpus-with-other-vendor-in-template": {
        "spec.inference.gpuResource": "amd.com/gpu",
        "spec.inference.template": {"spec": {"containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
    },
    "sidecar-with-gpus": {"spec.trainer.template": {"spec": {"containers": [{"name": "aux", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    "dataset-from-the-hub": {"spec.rollout.dataset": {"uri": "hf://openai/gsm8k@main", "path": "main/train.parquet", "credentialsSecret": "hf"}},
    "model-from-the-hub": {"spec.model": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct@main", "credentialsSecret": "hf", "cache": {"claimName": "hf-cache"}}},
    "env-from-secret": {"spec.inference.env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]},
    "two-node-cell": {"spec.inference.gpusPerEngine": 16, "spec.inference.tensorParallelSize": 8},
    "cell-smaller-than-node": {"spec.inference.gpusPerEngine": 3, "spec.inference.tensorParallelSize": DELETE},
    "cpu-engines": {"spec.inference.gpusPerEngine": 0},
    "gloo-on-cpu-engines": {"spec.inference.gpusPerEngine": 0, "spec.inference.weightUpdate.method": "gloo"},
    "gloo-on-gpu-engines": {"spec.inference.weightUpdate.method": "gloo", "spec.inference.weightUpdate.bucketMegabytes": 64},
    "nccl-on-gpu-engines": {"spec.inference.weightUpdate.method": "nccl", "spec.inference.weightUpdate.transferTimeoutSeconds": 30},
    "tp-times-pp": {"spec.inference.gpusPerEngine": 16, "spec.inference.tensorParallelSize": 8, "spec.inference.pipelineParallelSize": 2},
    "offload-disabled-without-tags": {"spec.inference.offload": {"enabled": False, "tags": []}},
    "colocate-false-with-offload": {"spec.trainer.colocate": False, "spec.inference.offload": {"enabled": True}},
    "reinforce-group-of-one": {"spec.rollout.sampling.nSamplesPerPrompt": 1, "spec.trainer.reference.algorithm": "reinforce"},
    "own-trainer-group-of-one": {"spec.rollout.sampling.nSamplesPerPrompt": 1, "spec.trainer.command": ["python", "t.py"]},
    "workload-ref-only": {
        "spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"},
    },
    "workload-ref-without-rollout": {"spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"}, "spec.rollout": DELETE},
    "backoff-equals-max": {"spec.inference.restartPolicy.backoffSeconds": 300},
    "greedy-eval-one-sample": {"spec.rollout.eval": {"everySteps": 10}},
    "sampled-eval-several-samples": {"spec.rollout.eval": {"everySteps": 10, "samplesPerPrompt": 4, "temperature": 1}},
    "stale-samples-default-correction": {"spec.rollout.maxStaleness": 4},
    "stale-samples-clipped": {"spec.trainer.reference.offPolicy": {"mode": "clip", "clipEpsHigh": 0.28}},
    "on-policy-without-correction": {"spec.rollout.maxStaleness": 0, "spec.trainer.reference.offPolicy": {"mode": "none"}},
    "own-trainer-stale-without-correction": {
        "spec.trainer.command": ["python", "t.py"], "spec.trainer.reference.offPolicy": {"mode": "none"},
    },
    "save-every-old-spelling": {"spec.trainer.reference.saveEverySteps": DELETE, "spec.trainer.reference.saveEvery": 20},
    "save-every-both-spellings-agree": {"spec.trainer.reference.saveEvery": 50},
    "integer-valued-seconds": {"spec.inference.healthCheck.intervalSeconds": 10, "spec.inference.healthCheck.timeoutSeconds": 2.5},
}

# Updates of a stored object (old_edits) to a new one (edits).
IMMUTABLE = [
    Case("engine-changed", {"spec.inference.engine": "sglang"}, "spec.inference.engine", S.ENGINE_IMMUTABLE_MSG),
    Case(
        "gpus-per-engine-changed",
        {"spec.inference.gpusPerEngine": 4, "spec.inference.tensorParallelSize": 4},
        "spec.inference.gpusPerEngine",
        S.GPUS_PER_ENGINE_IMMUTABLE_MSG,
    ),
    Case("gpus-per-node-changed", {"spec.inference.gpusPerNode": 4}, "spec.inference.gpusPerNode", S.GPUS_PER_NODE_IMMUTABLE_MSG),
    Case("port-changed", {"spec.inference.port": 8001}, "spec.inference.port", S.PORT_IMMUTABLE_MSG),
    Case(
        "weight-method-changed",
        {"spec.inference.weightUpdate.method": "nccl"},
        "spec.inference.weightUpdate.method",
        S.WEIGHT_METHOD_IMMUTABLE_MSG,
    ),
    Case(
        "shared-path-changed",
        {"spec.inference.weightUpdate.sharedPath": "/weights"},
        "spec.inference.weightUpdate.sharedPath",
        S.SHARED_PATH_IMMUTABLE_MSG,
    ),
    Case("model-changed", {"spec.model.pvc.subPath": "Llama-3.1-8B"}, "spec.model", S.MODEL_IMMUTABLE_MSG),
    Case("model-tokenizer-changed", {"spec.model.tokenizer": "/models/tok"}, "spec.model", S.MODEL_IMMUTABLE_MSG),
    Case(
        "rollout-removed",
        {"spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"}, "spec.rollout": DELETE},
        "spec.rollout",
        S.ROLLOUT_PRESENCE_IMMUTABLE_MSG,
        old_edits={"spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"}},
    ),
    Case(
        "rollout-added",
        {"spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"}},
        "spec.rollout",
        S.ROLLOUT_PRESENCE_IMMUTABLE_MSG,
        old_edits={"spec.trainer.workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"}, "spec.rollout": DELETE},
    ),
]

# Updates that must be accepted.
MUTABLE_EDITS = {
    "scale-engines": {"spec.inference.replicas": 8},
    "scale-trainers": {"spec.trainer.replicas": 2},
    "suspend": {"spec.suspend": True},
    "more-steps": {"spec.trainer.reference.steps": 1000},
    "engine-written-as-its-default": {"spec.inference.gpusPerNode": 8},
    "port-written-as-its-default": {"spec.inference.port": 8000},
    "engine-image": {"spec.inference.image": "vllm/vllm-openai:v0.33.0"},
    "health-check": {"spec.inference.healthCheck": {"intervalSeconds": 10, "failureThreshold": 5}},
    "lock-timeout": {"spec.inference.weightUpdate.lockTimeoutSeconds": 900},
}


@dataclass(frozen=True)
class Malformed:
    """A spec the schema itself refuses (no CEL): unknown field, wrong type, out of range."""

    id: str
    edits: dict[str, Any]
    field: str
    apiserver_says: str  # what kube-apiserver's error carries besides the field

    def manifest(self) -> dict[str, Any]:
        return edited(load_manifest(), self.edits)


MALFORMED = [
    Malformed("unknown-field", {"spec.inference.gpuPerEngine": 2}, "spec.inference.gpuPerEngine", "unknown field"),
    Malformed("unknown-nested-field", {"spec.rollout.sampling.samples": 4}, "spec.rollout.sampling.samples", "unknown field"),
    Malformed("string-for-integer", {"spec.inference.replicas": "four"}, "spec.inference.replicas", "must be of type integer"),
    Malformed("string-for-list", {"spec.inference.engineArgs": "--enforce-eager"}, "spec.inference.engineArgs", "must be of type array"),
    Malformed("negative-replicas", {"spec.inference.replicas": -1}, "spec.inference.replicas", "greater than or equal to 0"),
    Malformed("negative-gpus", {"spec.inference.gpusPerEngine": -2}, "spec.inference.gpusPerEngine", "greater than or equal to 0"),
    Malformed("negative-trainers", {"spec.trainer.replicas": -1}, "spec.trainer.replicas", "greater than or equal to 0"),
    Malformed(
        "zero-samples", {"spec.rollout.sampling.nSamplesPerPrompt": 0}, "spec.rollout.sampling.nSamplesPerPrompt",
        "greater than or equal to 1",
    ),
    Malformed(
        "zero-interval", {"spec.inference.healthCheck.intervalSeconds": 0}, "spec.inference.healthCheck.intervalSeconds",
        "greater than 0",
    ),
    Malformed("unknown-engine", {"spec.inference.engine": "tgi"}, "spec.inference.engine", 'Unsupported value: "tgi"'),
    Malformed("model-uri-not-hf", {"spec.model": {"uri": "s4://bucket/model"}}, "spec.model.uri", "should match"),
    Malformed("bad-reward-path", {"spec.rollout.reward.function": "not a function"}, "spec.rollout.reward.function", "should match"),
    Malformed("missing-dataset", {"spec.rollout": {"batchSize": 4}}, "spec.rollout.dataset", "Required value"),
    Malformed("too-many-tags", {"spec.inference.offload.tags": ["weights"] * 4}, "spec.inference.offload.tags", "must have at most 3 items"),
    Malformed(
        "unknown-off-policy-mode", {"spec.trainer.reference.offPolicy.mode": "ppo"}, "spec.trainer.reference.offPolicy.mode",
        'Unsupported value: "ppo"',
    ),
    Malformed(
        "clip-eps-low-one", {"spec.trainer.reference.offPolicy.clipEpsLow": 1}, "spec.trainer.reference.offPolicy.clipEpsLow",
        "should be less than 1",
    ),
    Malformed(
        "tis-cap-below-one", {"spec.trainer.reference.offPolicy.tisCap": 0.5}, "spec.trainer.reference.offPolicy.tisCap",
        "greater than or equal to 1",
    ),
    Malformed("negative-grad-norm", {"spec.trainer.reference.maxGradNorm": -1}, "spec.trainer.reference.maxGradNorm",
              "greater than or equal to 0"),
]


def sample(annotation: Any, name: str = "") -> Any:
    """A value for every field of a type, recursively: new status fields are covered without edits here."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)), name)
    if origin is typing.Literal:
        return args[0]
    if origin is list:
        return [sample(args[0], name)]
    if origin is dict:
        return {"k": sample(args[1], name)}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {f.alias or n: sample(f.annotation, n) for n, f in annotation.model_fields.items()}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(iter(annotation)).value
    if annotation is bool:
        return True
    if annotation is int:
        return 1
    if annotation is float:
        return 0.5
    return "True" if name == "status" else "x"
