"""The user's intent: `RLJob.spec`.

These models are the one source of truth for the CRD (`crds/rljob.yaml` is generated from
them), for local mode's manifest parsing and for the reconciler. Descriptions are written
for the person reading `kubectl explain rlj.spec...` and the generated reference.
Cross-field rules that the API server must enforce are attached as CEL rules
(`x-kubernetes-validations`) and mirrored by pydantic validators so that local mode rejects
the same manifests with the same messages. Rules that compare with the stored object
(immutable fields) are transition rules: the API server checks them on update, and
`RLJobSpec.validate_update` checks them where there is no API server.

Strings and lists carry `maxLength`/`maxItems` bounds: the API server estimates the cost of
every CEL rule from these bounds and refuses a CRD whose rules could cost too much.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from controller_runtime.api.base import ApiModel
from controller_runtime.api.podtemplate import (
    DEFAULT_GPU_RESOURCE,
    GPU_RESOURCE_PATTERN,
    K8S_SCHEMA,
    OWNED,
    PodTemplate,
    cel_rules,
    env_conflict,
    env_rule,
    template_conflict,
)
from controller_runtime.api.workloads import (
    SUPPORTED_TEXT,
    UNSUPPORTED_WORKLOAD_MSG,
    WORKLOAD_REF_RULE,
    workload_kind,
)

CEL = "x-kubernetes-validations"

# Bounds shared by many fields; generous, but finite so CEL cost estimates stay small.
MAX_PATH = 4096
MAX_NAME = 253
MAX_IMAGE = 512
MAX_ARGS = 256
MAX_ENV = 256


def cel(*rules: tuple[str, str] | tuple[str, str, str] | dict[str, str]) -> dict[str, Any]:
    """json_schema_extra carrying CEL rules: (rule, message[, fieldPath]) or a full rule dict
    (keys as in the CRD: rule, message, messageExpression, fieldPath, reason)."""
    out = []
    for r in rules:
        if isinstance(r, dict):
            out.append(dict(r))
            continue
        item = {"rule": r[0], "message": r[1]}
        if len(r) > 2:
            item["fieldPath"] = r[2]
        out.append(item)
    return {CEL: out}


class Engine(StrEnum):
    """The built-in engines' names; what an engine is lies in its row of `controller_runtime.engines.ENGINES`."""

    vllm = "vllm"
    sglang = "sglang"


def known_engine(name: str) -> str:
    """An engine with a row in the engine table (which imports this module, hence the late import)."""
    from controller_runtime.engines import ENGINES

    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINES)}")
    return name


class _EngineTableEnum:
    """The schema's (and so the CRD's) enum of engine names: the engine table's rows."""

    @staticmethod
    def __get_pydantic_json_schema__(core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        from controller_runtime.engines import ENGINES

        return {"type": "string", "enum": [str(name) for name in ENGINES]}


EngineName = Annotated[str, AfterValidator(known_engine), _EngineTableEnum()]


class MemoryTag(StrEnum):
    """What an engine can release and take back (miles' offload levels)."""

    weights = "weights"
    kv_cache = "kv_cache"
    cuda_graph = "cuda_graph"


class PvcSource(ApiModel):
    """A PersistentVolumeClaim and a path inside it."""

    claim_name: str = Field(min_length=1, max_length=MAX_NAME, description="Name of the PersistentVolumeClaim (in the RLJob's namespace).")
    sub_path: str = Field(default="", max_length=MAX_PATH, description="Path inside the claim.")


MODEL_SOURCE_MSG = "spec.model: set path, pvc or uri (where the weights are)"
MODEL_URI_EXCLUSIVE_MSG = "spec.model.uri excludes spec.model.path and spec.model.pvc: the weights come from one place"
MODEL_URI_PATTERN = r"^hf://[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$"
MODEL_IMMUTABLE_MSG = "spec.model is immutable; create a new RLJob to change the model"


class ModelSpec(ApiModel):
    """Where the policy's initial weights live. Mounted read-only into engines and trainers. Immutable."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("has(self.path) || has(self.pvc) || has(self.uri)", MODEL_SOURCE_MSG),
            ("!has(self.uri) || (!has(self.path) && !has(self.pvc))", MODEL_URI_EXCLUSIVE_MSG, ".uri"),
            ("self == oldSelf", MODEL_IMMUTABLE_MSG),
        )
    }

    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH,
        description="Path to a HuggingFace-format model directory (local mode, or a hostPath/volume path).",
    )
    pvc: PvcSource | None = Field(default=None, description="PVC holding the model; mounted at /models in engine and trainer pods.")
    uri: str | None = Field(
        default=None,
        max_length=MAX_PATH,
        pattern=MODEL_URI_PATTERN,
        description=(
            "hf://ORG/NAME[@REVISION]: a Hugging Face repository, downloaded by an init container of every pod "
            "that reads the model (into spec.model.cache, else the pod's own volume) and mounted at /models."
        ),
    )
    credentials_secret: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME,
        description="Secret (in the RLJob's namespace) whose key HF_TOKEN is the token the download uses.",
    )
    cache: PvcSource | None = Field(
        default=None,
        description="PVC the download goes to, so that recreated pods do not download again (one per pod otherwise).",
    )
    tokenizer: str | None = Field(default=None, max_length=MAX_PATH, description="Tokenizer directory; defaults to the model directory.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.path is None and self.pvc is None and self.uri is None:
            raise ValueError(MODEL_SOURCE_MSG)
        if self.uri is not None and (self.path is not None or self.pvc is not None):
            raise ValueError(MODEL_URI_EXCLUSIVE_MSG)
        return self


class HealthCheckSpec(ApiModel):
    """Engine health probing (miles' rollout health check). Failures are consecutive; one success resets."""

    interval_seconds: float = Field(default=30, gt=0, description="Seconds between probes of one cell.")
    timeout_seconds: float = Field(default=30, gt=0, description="A probe not answered within this many seconds is a failure.")
    failure_threshold: int = Field(default=3, ge=1, description="Consecutive failed probes that make a cell Unhealthy.")
    initial_delay_seconds: float = Field(default=0, ge=0, description="Grace period after start and after every resume before the first probe counts.")
    startup_deadline_seconds: float = Field(default=1800, gt=0, description="A cell still starting after this long is Unhealthy (StartupDeadlineExceeded).")
    scheduling_deadline_seconds: float = Field(default=300, gt=0, description="A multi-pod cell with some pods scheduled and others not after this long is deleted and retried after the restart backoff (SchedulingDeadlineExceeded), so that it never holds GPUs partially.")


RESTART_BACKOFF_MSG = "spec.inference.restartPolicy.backoffSeconds must not exceed spec.inference.restartPolicy.maxBackoffSeconds"


class RestartPolicySpec(ApiModel):
    """A restart budget: never an unbounded crash loop."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("self.backoffSeconds <= self.maxBackoffSeconds", RESTART_BACKOFF_MSG, ".backoffSeconds"),
        )
    }

    backoff_seconds: float = Field(default=5, ge=0, description="First delay before recreating an unhealthy cell; doubles after each failed restart.")
    max_backoff_seconds: float = Field(default=300, ge=0, description="Upper bound of the restart delay.")
    max_restarts: int = Field(default=5, ge=0, description="Recreations allowed per cell; when spent, the job reports EnginesHealthy=False/RestartBudgetExhausted.")

    @model_validator(mode="after")
    def _backoff_bounded(self) -> RestartPolicySpec:
        if self.backoff_seconds > self.max_backoff_seconds:
            raise ValueError(RESTART_BACKOFF_MSG)
        return self


OFFLOAD_TAGS_MSG = "spec.inference.offload.tags must name at least one of weights, kv_cache, cuda_graph when offload is enabled"


class OffloadSpec(ApiModel):
    """Release engine GPU memory while the trainer runs on the same GPUs (colocated mode)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(("!self.enabled || size(self.tags) > 0", OFFLOAD_TAGS_MSG, ".tags")),
    }

    enabled: bool = Field(default=False, description="Offload engines around each training step.")
    tags: list[MemoryTag] = Field(
        default_factory=lambda: [MemoryTag.weights, MemoryTag.kv_cache, MemoryTag.cuda_graph],
        max_length=3,
        description="What to release: weights, kv_cache, cuda_graph.",
    )

    @model_validator(mode="after")
    def _tags_when_enabled(self) -> OffloadSpec:
        if self.enabled and not self.tags:
            raise ValueError(OFFLOAD_TAGS_MSG)
        return self


class RouterSpec(ApiModel):
    """An external router in front of the serving cells."""

    url: str = Field(min_length=1, max_length=2048, description="Base URL of an external router (e.g. sglang-router); serving cells are registered with it.")


class EvalFleetSpec(ApiModel):
    """A frozen fleet pinned to a checkpoint, used for evaluation only. It never takes weight updates."""

    replicas: int = Field(default=1, ge=1, le=1024, description="Eval cells.")
    checkpoint: str = Field(min_length=1, max_length=MAX_PATH, description="Weights directory the eval fleet is pinned to (required: an eval fleet without a checkpoint has nothing to evaluate).")
    weight_version: str = Field(min_length=1, max_length=MAX_NAME, description="Version every eval engine must report before eval runs.")


class WeightUpdateMethod(StrEnum):
    """disk: files on shared storage; nccl/gloo: one broadcast into a process group of the
    window (the same code; nccl moves GPU buffers, gloo CPU ones, e.g. for CPU engines)."""

    disk = "disk"
    nccl = "nccl"
    gloo = "gloo"


class PauseMode(StrEnum):
    abort = "abort"
    wait = "wait"
    keep = "keep"


class WeightUpdateSpec(ApiModel):
    """How new weights reach the engines after each training step."""

    method: WeightUpdateMethod = Field(default=WeightUpdateMethod.disk, description="disk: safetensors on shared storage + engine reload; nccl: bucketed broadcast from the trainer into a process group of the window's engines (GPU engines only); gloo: the same broadcast over gloo (CPU engines, or GPUs without NCCL). Immutable.")
    pause_mode: PauseMode = Field(default=PauseMode.wait, description="How in-flight requests are treated while weights change (vLLM /pause?mode=).")
    check_weights: bool = Field(default=False, description="Snapshot engine weight checksums before, compare after (miles check_weight_update_equal).")
    lock_timeout_seconds: float = Field(default=600, gt=0, description="An update window left open longer than this is aborted and reported.")
    ready_timeout_seconds: float = Field(default=60, ge=0, description="A window first waits up to this long for cells that are starting, then opens over the ready ones (miles start_update_weights ready_timeout); 0: only the cells ready at that instant.")
    bucket_megabytes: int = Field(default=512, ge=1, le=65536, description="nccl/gloo: tensors are packed into broadcasts of at most this many MiB (a larger tensor goes alone).")
    transfer_timeout_seconds: float = Field(default=120, gt=0, le=86400, description="nccl/gloo: bound on forming the group and on each broadcast; a peer that dies or never joins fails the window after this long.")
    shared_path: str = Field(default="/checkpoints", min_length=1, max_length=MAX_PATH, description="Shared directory where the trainer writes weights for disk updates. Immutable.")
    pvc: PvcSource | None = Field(default=None, description="PVC mounted at sharedPath in engine and trainer pods (disk updates across pods need shared storage).")


class Toleration(ApiModel):
    """A Pod toleration (same fields as the Pod spec's)."""

    key: str | None = Field(default=None, max_length=316, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal (the Pod spec's default is Equal).")
    value: str | None = Field(default=None, max_length=63, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(default=None, description="Taint effect to match; empty matches all effects.")
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long the pod stays bound after the taint appears.")


class EnvVar(ApiModel):
    """An environment variable: a value, or one read from a Secret, ConfigMap or the pod (valueFrom)."""

    name: str = Field(min_length=1, max_length=MAX_NAME, description="Variable name.")
    value: str = Field(default="", max_length=32768, description="Variable value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={K8S_SCHEMA: "EnvVarSource", "type": "object"},
        description="A Kubernetes EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef (e.g. HF_TOKEN from a Secret).",
    )

    def to_pod(self) -> dict[str, Any]:
        """The Pod spec's env entry."""
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": self.value_from}
        return {"name": self.name, "value": self.value}


class Resources(ApiModel):
    """Container resources, Kubernetes quantities as strings."""

    requests: dict[str, str] = Field(default_factory=dict, max_length=32, description="Resource requests, e.g. {cpu: \"4\", memory: 32Gi}.")
    limits: dict[str, str] = Field(default_factory=dict, max_length=32, description="Resource limits, e.g. {memory: 64Gi}.")


class PodMetadata(ApiModel):
    """Extra metadata for the pods the operator creates."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=64, description="Extra labels on the pods.")
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64, description="Extra annotations on the pods.")


class Placement(ApiModel):
    """Where pods may run. Fields mirror the Pod spec."""

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=64, description="Node labels the pods require, e.g. nvidia.com/gpu.product.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Taints the pods tolerate.")
    affinity: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
        description="A Pod affinity block (nodeAffinity, podAffinity, podAntiAffinity), passed through unchanged.",
    )
    priority_class_name: str | None = Field(default=None, max_length=MAX_NAME, description="PriorityClass of the pods.")


def cell_shape_message(gpus_per_engine: int, gpus_per_node: int) -> str:
    """The text of the cell-shape rule's messageExpression, for the pydantic mirror."""
    lower = gpus_per_engine // gpus_per_node * gpus_per_node
    return (
        f"spec.inference.gpusPerEngine ({gpus_per_engine}) must be a multiple of spec.inference.gpusPerNode "
        f"({gpus_per_node}) when it is larger, because a cell spans whole nodes; use {lower} or {lower + gpus_per_node}"
    )


CELL_SHAPE_MSG = (
    "spec.inference.gpusPerEngine must be a multiple of spec.inference.gpusPerNode when it is larger "
    "(a cell spans whole nodes); use e.g. 8, 16 or 24 GPUs with 8 per node"
)
# format(), not `+ string(int)`: the API server's cost estimator prices string(int) as an
# unbounded string and refuses the CRD ("messageExpression cost exceeds budget by 100x").
CELL_SHAPE_MSG_EXPR = (
    "'spec.inference.gpusPerEngine (%d) must be a multiple of spec.inference.gpusPerNode (%d) when it is larger, "
    "because a cell spans whole nodes; use %d or %d'.format([self.gpusPerEngine, self.gpusPerNode, "
    "self.gpusPerEngine / self.gpusPerNode * self.gpusPerNode, (self.gpusPerEngine / self.gpusPerNode + 1) * self.gpusPerNode])"
)
TP_PP_PRODUCT_MSG = (
    "spec.inference.tensorParallelSize x spec.inference.pipelineParallelSize must equal spec.inference.gpusPerEngine "
    "(every GPU of a cell holds one shard)"
)
TP_DIVIDES_MSG = "spec.inference.tensorParallelSize must divide spec.inference.gpusPerEngine"
NCCL_NEEDS_GPUS_MSG = (
    "spec.inference.weightUpdate.method nccl needs GPU engines (gpusPerEngine >= 1); use method gloo or disk for CPU engines"
)
ENGINE_IMMUTABLE_MSG = "spec.inference.engine is immutable; create a new RLJob to switch engines"
GPUS_PER_ENGINE_IMMUTABLE_MSG = "spec.inference.gpusPerEngine is immutable; create a new RLJob to change the cell shape"
GPUS_PER_NODE_IMMUTABLE_MSG = "spec.inference.gpusPerNode is immutable; create a new RLJob to change the cell shape"
PORT_IMMUTABLE_MSG = (
    "spec.inference.port is immutable: the engines' Services and NetworkPolicy would move to the new port at once "
    "while the running cells listen on the old one; create a new RLJob to change it"
)
WEIGHT_METHOD_IMMUTABLE_MSG = (
    "spec.inference.weightUpdate.method is immutable: running engines were started for their method (its "
    "weight-transfer engine or worker extension) and could not take the next update; create a new RLJob to change it"
)
SHARED_PATH_IMMUTABLE_MSG = (
    "spec.inference.weightUpdate.sharedPath is immutable: running engines read new weights there and the "
    "executor keeps its dataset position under it; create a new RLJob to change it"
)


class InferenceSpec(ApiModel):
    """The engine fleet: `replicas` cells of `gpusPerEngine` GPUs; a cell spans ceil(gpusPerEngine/gpusPerNode) pods."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            {
                "rule": "self.gpusPerEngine <= self.gpusPerNode || self.gpusPerEngine % self.gpusPerNode == 0",
                "message": CELL_SHAPE_MSG,
                "messageExpression": CELL_SHAPE_MSG_EXPR,
                "fieldPath": ".gpusPerEngine",
            },
            (
                "self.gpusPerEngine == 0 || !has(self.tensorParallelSize) || !has(self.pipelineParallelSize)"
                " || self.tensorParallelSize * self.pipelineParallelSize == self.gpusPerEngine",
                TP_PP_PRODUCT_MSG,
                ".tensorParallelSize",
            ),
            (
                "self.gpusPerEngine == 0 || !has(self.tensorParallelSize) || self.gpusPerEngine % self.tensorParallelSize == 0",
                TP_DIVIDES_MSG,
                ".tensorParallelSize",
            ),
            ("self.weightUpdate.method != 'nccl' || self.gpusPerEngine > 0", NCCL_NEEDS_GPUS_MSG, ".weightUpdate.method"),
            ("self.engine == oldSelf.engine", ENGINE_IMMUTABLE_MSG, ".engine"),
            ("self.gpusPerEngine == oldSelf.gpusPerEngine", GPUS_PER_ENGINE_IMMUTABLE_MSG, ".gpusPerEngine"),
            ("self.gpusPerNode == oldSelf.gpusPerNode", GPUS_PER_NODE_IMMUTABLE_MSG, ".gpusPerNode"),
            ("self.port == oldSelf.port", PORT_IMMUTABLE_MSG, ".port"),
            ("self.weightUpdate.method == oldSelf.weightUpdate.method", WEIGHT_METHOD_IMMUTABLE_MSG, ".weightUpdate.method"),
            (
                "self.weightUpdate.sharedPath == oldSelf.weightUpdate.sharedPath",
                SHARED_PATH_IMMUTABLE_MSG,
                ".weightUpdate.sharedPath",
            ),
            *cel_rules(OWNED["inference"]),
            env_rule("inference"),
        )
    }

    engine: EngineName = Field(default=Engine.vllm, description="Inference engine: vllm or sglang. Immutable.")
    image: str = Field(default="vllm/vllm-openai:v0.32.0", min_length=1, max_length=MAX_IMAGE, description="Engine container image.")
    replicas: int = Field(default=1, ge=0, le=1024, description="Number of engine cells (data-parallel engines). Can be changed live.")
    gpus_per_engine: int = Field(default=1, ge=0, le=512, description="GPUs of one engine (tensor x pipeline parallel). 0 runs on CPU (local mode, tests). Immutable.")
    gpus_per_node: int = Field(default=8, ge=1, le=64, description="GPUs per node; a cell spans ceil(gpusPerEngine/gpusPerNode) pods. Immutable.")
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=512, description="Defaults to min(gpusPerEngine, gpusPerNode).")
    pipeline_parallel_size: int | None = Field(default=None, ge=1, le=512, description="Defaults to the number of pods in a cell.")
    port: int = Field(default=8000, ge=1, le=65535, description="Engine HTTP port. Immutable.")
    engine_args: list[str] = Field(default_factory=list, max_length=MAX_ARGS, description="Extra engine command-line arguments.")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description="Extra engine environment.")
    resources: Resources = Field(default_factory=Resources, description="Engine container resources besides GPUs (GPUs come from gpusPerEngine).")
    placement: Placement = Field(default_factory=Placement, description="nodeSelector, tolerations, affinity, priorityClassName of engine pods.")
    pod_metadata: PodMetadata = Field(default_factory=PodMetadata, description="Extra labels/annotations on engine pods.")
    gpu_resource: str = Field(
        default=DEFAULT_GPU_RESOURCE, min_length=1, max_length=MAX_NAME, pattern=GPU_RESOURCE_PATTERN,
        description="Extended resource name of a GPU on your nodes, e.g. nvidia.com/gpu or amd.com/gpu.",
    )
    template: PodTemplate | None = Field(
        default=None,
        description=(
            "A pod template merged into the engine pods the operator builds (volumes, sidecars, init containers, "
            "imagePullSecrets, securityContext, envFrom...); env, resources, placement and podMetadata are shorthands merged before it. "
            "Fields the operator owns are refused."
        ),
    )
    health_check: HealthCheckSpec = Field(default_factory=HealthCheckSpec, description="How engine health is probed.")
    restart_policy: RestartPolicySpec = Field(default_factory=RestartPolicySpec, description="How unhealthy cells are recreated, and how often at most.")
    offload: OffloadSpec = Field(default_factory=OffloadSpec, description="Start engines able to release their GPU memory, for the controller API's offload/onload (a trainer of your own that shares their GPUs).")
    weight_update: WeightUpdateSpec = Field(default_factory=WeightUpdateSpec, description="How new weights reach the engines.")
    router: RouterSpec | None = Field(default=None, description="Optional external router; absent means clients use the <job>-engines Service.")
    eval: EvalFleetSpec | None = Field(default=None, description="Optional eval fleet pinned to a checkpoint.")

    @property
    def pods_per_cell(self) -> int:
        if self.gpus_per_engine <= self.gpus_per_node:
            return 1
        return -(-self.gpus_per_engine // self.gpus_per_node)

    @property
    def gpus_per_pod(self) -> int:
        return min(self.gpus_per_engine, self.gpus_per_node)

    @model_validator(mode="after")
    def _cell_shape(self) -> InferenceSpec:
        gpus, tp, pp = self.gpus_per_engine, self.tensor_parallel_size, self.pipeline_parallel_size
        if gpus > self.gpus_per_node and gpus % self.gpus_per_node:
            raise ValueError(cell_shape_message(gpus, self.gpus_per_node))
        if gpus and tp is not None and pp is not None and tp * pp != gpus:
            raise ValueError(TP_PP_PRODUCT_MSG)
        if gpus and tp is not None and gpus % tp:
            raise ValueError(TP_DIVIDES_MSG)
        if self.weight_update.method == WeightUpdateMethod.nccl and gpus == 0:
            raise ValueError(NCCL_NEEDS_GPUS_MSG)
        conflict = env_conflict("inference", self.env) or template_conflict(OWNED["inference"], self.template, self.gpu_resource)
        if conflict:
            raise ValueError(conflict)
        return self


class DatasetFormat(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"
    chat = "chat"


DATASET_URI_EXCLUSIVE_MSG = "spec.rollout.dataset.uri excludes spec.rollout.dataset.pvc: the prompts come from one place"


class DatasetSpec(ApiModel):
    """The prompts the executor samples from."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(("!has(self.uri) || !has(self.pvc)", DATASET_URI_EXCLUSIVE_MSG, ".uri")),
    }

    path: str = Field(min_length=1, max_length=MAX_PATH, description="JSONL or Parquet file of prompts (a path inside the executor pod, or local path in local mode).")
    pvc: PvcSource | None = Field(default=None, description="PVC holding the dataset, mounted at /data in the executor pod; path is then relative to /data.")
    uri: str | None = Field(
        default=None,
        max_length=MAX_PATH,
        pattern=MODEL_URI_PATTERN,
        description=(
            "hf://ORG/NAME[@REVISION]: a Hugging Face dataset repository, downloaded by an init container of the "
            "executor pod; path is then the file inside the repository."
        ),
    )
    credentials_secret: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME,
        description="Secret (in the RLJob's namespace) whose key HF_TOKEN is the token the download uses.",
    )
    format: DatasetFormat | None = Field(default=None, description="jsonl or parquet: prompt text in promptField (default: the file extension). chat: rows (JSONL, or Parquet by extension) whose messagesField holds a conversation, rendered with the model's chat template and generated from its token ids.")
    messages_field: str = Field(default="messages", min_length=1, max_length=MAX_NAME, description="With format chat: the field holding the conversation, a list of {role, content} messages.")
    prompt_field: str = Field(default="prompt", min_length=1, max_length=MAX_NAME, description="Field holding the prompt text.")
    label_field: str | None = Field(default="label", max_length=MAX_NAME, description="Field handed to the reward function as the reference answer; empty for rewards that need none (null means the same, but client-side `kubectl apply` drops nulls, so write \"\").")
    shuffle: bool = Field(default=True, description="Shuffle deterministically each epoch.")
    seed: int = Field(default=0, description="Seed of the shuffle; the position is saved so a restart resumes.")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        if self.uri is not None and self.pvc is not None:
            raise ValueError(DATASET_URI_EXCLUSIVE_MSG)
        return self


class SamplingSpec(ApiModel):
    """How each prompt is sampled."""

    n_samples_per_prompt: int = Field(default=8, ge=1, le=1024, description="Samples per prompt (one GRPO group; at least 2 for GRPO).")
    max_tokens: int = Field(default=64, ge=1, le=1_048_576, description="New tokens per sample.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling.")


class RewardOnError(StrEnum):
    score = "score"
    drop = "drop"


class RewardSpec(ApiModel):
    """The reward function that scores each sample."""

    function: str = Field(
        default="rollout_executor.rewards:exact_match",
        max_length=MAX_NAME,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Import path `module:function` of the reward; built-ins in rollout_executor.rewards: exact_match, regex_match, math_answer, token_set_fraction.",
    )
    args: dict[str, Any] = Field(default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"}, description="Keyword arguments for the reward function.")
    workers: int = Field(default=2, ge=1, le=1024, description="Worker processes that run a synchronous reward function, so that it never stalls generation (an async reward runs on the executor's event loop). A worker that dies or hangs is replaced.")
    timeout_seconds: float = Field(default=60.0, gt=0, le=86400, description="Longest one reward call may take; a call past it (its worker is killed and replaced) fails that sample as onError says.")
    on_error: RewardOnError = Field(default=RewardOnError.score, description="A reward that raises, times out or returns no finite number: score gives the sample errorReward; drop takes the sample out of its group. Either way it is counted (rljob_executor_sample_failures_total) and recorded in the batch's meta, and the rollout goes on up to spec.rollout.failureBudget.")
    error_reward: float = Field(default=0.0, description="The reward a failed sample gets with onError: score.")


class OnWeightUpdate(StrEnum):
    drain = "drain"
    abort = "abort"


class RayClusterSpec(ApiModel):
    """Run the executor's Ray on a KubeRay RayCluster instead of inside the executor pod."""

    ray_version: str = Field(default="2.60.0", max_length=64, description="Ray version of the RayCluster.")
    image: str = Field(default="rayproject/ray:2.60.0", max_length=MAX_IMAGE, description="Ray image.")
    workers: int = Field(default=0, ge=0, le=1024, description="CPU worker replicas.")


EVAL_SAMPLES_NEED_TEMPERATURE_MSG = (
    "spec.rollout.eval.samplesPerPrompt > 1 needs spec.rollout.eval.temperature > 0 "
    "(greedy decoding gives the same answer every time)"
)


class PolicyEvalSpec(ApiModel):
    """Evaluate the policy being trained every N steps: mean reward and pass@1 on an eval set.

    On the eval fleet (spec.inference.eval) when there is one, re-pinned to the step's exported
    weights for each evaluation; otherwise on the policy fleet, between the step's weight
    update and the next rollout. Results: status.lastEval, the executor's stats, and in local
    mode the run's summary and reward curve.
    """

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("self.samplesPerPrompt == 1 || self.temperature > 0.0", EVAL_SAMPLES_NEED_TEMPERATURE_MSG, ".temperature"),
        )
    }

    every_steps: int = Field(ge=1, le=1_000_000, description="Evaluate after every N training steps (and after the last step).")
    dataset: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH,
        description=(
            "JSONL or Parquet file of eval prompts, with spec.rollout.dataset's prompt and label fields (a path the "
            "executor reads: in a pod e.g. under /data when spec.rollout.dataset.pvc is set; in local mode relative "
            "to the manifest's directory). Default: the training dataset."
        ),
    )
    max_prompts: int = Field(default=64, ge=1, le=1_000_000, description="The first N prompts of the eval set, in file order (never shuffled, so every evaluation sees the same prompts).")
    samples_per_prompt: int = Field(default=1, ge=1, le=1024, description="Samples per eval prompt; pass@1 and the mean reward average over all of them.")
    max_tokens: int | None = Field(default=None, ge=1, le=1_048_576, description="New tokens per eval sample; default spec.rollout.sampling.maxTokens.")
    temperature: float = Field(default=0.0, ge=0, description="Eval sampling temperature; 0 is greedy (then samplesPerPrompt must be 1).")
    success_threshold: float | None = Field(
        default=None,
        description=(
            "A sample passes (counts for pass@1) when its reward is at least this. Default: the reward's own "
            "threshold: 1.0 for exact_match, regex_match and math_answer (a correct answer) and for custom rewards, "
            "0.5 for token_set_fraction (at least half of the response's tokens in the set)."
        ),
    )

    @model_validator(mode="after")
    def _samples_need_temperature(self) -> PolicyEvalSpec:
        if self.samples_per_prompt > 1 and self.temperature <= 0:
            raise ValueError(EVAL_SAMPLES_NEED_TEMPERATURE_MSG)
        return self


class RolloutSpec(ApiModel):
    """The RolloutExecutor: generation against the serving engines, scoring, batches for the trainers."""

    model_config = ApiModel.model_config | {"json_schema_extra": cel(*cel_rules(OWNED["rollout"]))}

    image: str = Field(default="ghcr.io/rljob/rollout-executor:0.1.0", min_length=1, max_length=MAX_IMAGE, description="RolloutExecutor image.")
    resources: Resources = Field(default_factory=Resources, description="Executor container resources.")
    pod_metadata: PodMetadata = Field(default_factory=PodMetadata, description="Extra labels/annotations on executor pods.")
    dataset: DatasetSpec = Field(description="Prompts to sample from.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Samples per prompt, length and temperature.")
    reward: RewardSpec = Field(default_factory=RewardSpec, description="Reward function.")
    batch_size: int = Field(default=8, ge=1, le=65536, description="Prompts per rollout (samples per rollout = batchSize x nSamplesPerPrompt).")
    max_staleness: int = Field(default=1, ge=0, le=1024, description="How many weight versions a sample may lag behind the current version when handed to a trainer.")
    concurrency: int = Field(default=16, ge=1, le=65536, description="In-flight generation requests per engine.")
    on_weight_update: OnWeightUpdate = Field(default=OnWeightUpdate.drain, description="drain: finish in-flight requests first; abort: abort and retry them on the new weights.")
    ray_cluster: RayClusterSpec | None = Field(default=None, description="Optional KubeRay RayCluster for the executor.")
    eval: PolicyEvalSpec | None = Field(default=None, description="Evaluate the policy every N steps (pass@1 and mean reward on an eval set).")
    function: str | None = Field(
        default=None,
        max_length=MAX_NAME,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description=(
            "Import path `module:function` of an async rollout function, called per prompt (or per group, see "
            "functionPerGroup) with an engine client and the dataset row; it returns samples (token ids, loss mask, "
            "logprobs, reward, metadata). Default: single-turn generation scored by spec.rollout.reward. A function "
            "that cannot be imported fails the executor at start."
        ),
    )
    function_args: dict[str, Any] = Field(default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"}, description="Keyword arguments for the rollout function.")
    function_per_group: bool = Field(default=False, description="Call the rollout function once per prompt with n = nSamplesPerPrompt and expect that many samples back, instead of once per sample.")
    function_timeout_seconds: float = Field(default=600.0, gt=0, le=86400, description="Longest one rollout-function call may take; past it the call's samples fail (counted against failureBudget).")
    failure_budget: float = Field(default=0.25, ge=0, le=1, description="Fraction of a rollout's samples that may fail (a reward or rollout function that raised, timed out or returned a malformed sample) before the rollout fails and the job reports the cause.")
    template: PodTemplate | None = Field(
        default=None,
        description=(
            "A pod template merged into the executor pods the operator builds (volumes, sidecars, init containers, "
            "imagePullSecrets, securityContext, envFrom...); resources and podMetadata are shorthands merged before it. "
            "Fields the operator owns are refused."
        ),
    )

    @model_validator(mode="after")
    def _template_leaves_the_operators_fields(self) -> RolloutSpec:
        conflict = template_conflict(OWNED["rollout"], self.template, None)
        if conflict:
            raise ValueError(conflict)
        return self


class OffPolicyMode(StrEnum):
    """How the reference trainer weighs a token sampled by the engine's policy (the behaviour policy).

    Both corrections use the engine's sampling logprob of each token as the behaviour policy
    (the trainer keeps no copy of older weights). A combined mode is not offered: with one
    optimizer step per rollout and no old-actor copy, miles' PPO clip with TIS reduces to
    one of the two (its TIS weight is 1 when the clip uses the rollout logprobs, its clip
    ratio is 1 when it does not), and applying both against the engine would count the same
    ratio twice.
    """

    none = "none"  # on-policy: no ratio (only safe with maxStaleness 0)
    clip = "clip"  # PPO clipped surrogate, ratio = pi_train / pi_engine (miles --use-rollout-logprobs)
    tis = "tis"  # truncated importance sampling: detached weight min(ratio, cap) (miles --use-tis)


class OffPolicySpec(ApiModel):
    """Importance correction for samples drawn under older weights (maxStaleness > 0) or by a numerically different engine."""

    mode: OffPolicyMode = Field(
        default=OffPolicyMode.tis,
        description=(
            "tis: weight each token's policy gradient by min(ratio, tisCap), detached (on-policy it is today's "
            "REINFORCE-style loss); clip: PPO clipped surrogate min(ratio x A, clip(ratio, 1 - clipEpsLow, "
            "1 + clipEpsHigh) x A); none: no correction (needs spec.rollout.maxStaleness: 0). "
            "ratio = exp(trainer logprob - engine sampling logprob)."
        ),
    )
    clip_eps_low: float = Field(default=0.2, gt=0, lt=1, description="mode clip: the ratio's lower bound is 1 - clipEpsLow (miles --eps-clip).")
    clip_eps_high: float = Field(default=0.2, gt=0, le=10, description="mode clip: the ratio's upper bound is 1 + clipEpsHigh (miles --eps-clip-high; DAPO's clip-higher uses 0.28).")
    tis_cap: float = Field(default=2.0, ge=1, le=1000, description="mode tis: the largest importance weight C in min(ratio, C) (miles --tis-clip).")


SAVE_EVERY_SPELLINGS_MSG = (
    "spec.trainer.reference.saveEvery is the old spelling of saveEverySteps and disagrees with it: "
    "set saveEverySteps only"
)


class ReferenceTrainerSpec(ApiModel):
    """The bundled torch trainer (GRPO/REINFORCE), used when spec.trainer.command and workloadRef are unset."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("!has(self.saveEvery) || self.saveEverySteps == 0 || self.saveEvery == self.saveEverySteps",
             SAVE_EVERY_SPELLINGS_MSG, ".saveEvery"),
        )
    }

    steps: int = Field(default=50, ge=1, description="Training steps (one rollout each).")
    learning_rate: float = Field(default=1e-3, gt=0, description="Adam learning rate.")
    algorithm: Literal["grpo", "reinforce"] = Field(default="grpo", description="grpo: advantages normalised within each prompt's group of samples; reinforce: reward minus the batch mean.")
    save_every_steps: int = Field(
        default=0, ge=0, le=1_000_000,
        description=(
            "Every N steps the trainer saves a checkpoint (full-precision model, optimizer, RNG states, step, "
            "weight version and the executor's dataset position) under the weight-sync path, and a restarted "
            "trainer resumes from the newest one; 0: no checkpoints (a restart resumes from the weight-sync "
            "files with a fresh optimizer)."
        ),
    )
    save_every: int | None = Field(default=None, ge=0, le=1_000_000, description="Deprecated: the old spelling of saveEverySteps, read when saveEverySteps is 0.")
    keep_checkpoints: int = Field(default=2, ge=1, le=1000, description="How many of the newest checkpoints are kept; older ones are deleted after each save.")
    max_grad_norm: float = Field(default=1.0, ge=0, description="Clip the global gradient norm to this value before each optimizer step (miles --clip-grad); 0 turns clipping off.")
    off_policy: OffPolicySpec = Field(default_factory=OffPolicySpec, description="Importance correction for samples drawn by another policy than the one being trained.")
    micro_batch_size: int = Field(default=0, ge=0, le=1_000_000, description="Samples per forward/backward pass; gradients accumulate over the whole batch before one optimizer step, so memory is bounded whatever the batch (0: the whole batch in one pass).")
    kl_coef: float = Field(default=0.0, ge=0, le=100, description="Weight of a KL penalty (k3 estimator) against the frozen initial model; 0 turns it off (no reference model is loaded).")

    @property
    def checkpoint_every(self) -> int:
        """Steps between checkpoints, whichever spelling the manifest used (0: none)."""
        return self.save_every_steps or self.save_every or 0

    @model_validator(mode="after")
    def _one_save_every(self) -> ReferenceTrainerSpec:
        if self.save_every is not None and self.save_every_steps not in (0, self.save_every):
            raise ValueError(SAVE_EVERY_SPELLINGS_MSG)
        return self

    def checkpoint_flags(self) -> list[str]:
        """The checkpoint settings as trainer flags, for trainer pods and local mode's trainer process alike."""
        return ["--save-every", str(self.checkpoint_every), "--keep-checkpoints", str(self.keep_checkpoints)]

    def loss_flags(self, temperature: float) -> list[str]:
        """The loss settings as `python -m rljob_client.trainer` flags: one table for the operator's
        trainer pods and local mode's trainer process, so neither can forget one (the sampling
        temperature included: the trainer must score the distribution the engines sampled)."""
        op = self.off_policy
        return [
            "--temperature", repr(temperature),
            "--max-grad-norm", repr(self.max_grad_norm),
            "--off-policy-mode", op.mode.value,
            "--clip-eps-low", repr(op.clip_eps_low),
            "--clip-eps-high", repr(op.clip_eps_high),
            "--tis-cap", repr(op.tis_cap),
            "--micro-batch-size", str(self.micro_batch_size),
            "--kl-coef", repr(self.kl_coef),
        ]  # fmt: skip


class WorkloadRef(ApiModel):
    """A Kubernetes object that runs the trainer; the job ends when it does (`workloads.TRAINER_WORKLOADS`)."""

    model_config = ApiModel.model_config | {"json_schema_extra": cel((WORKLOAD_REF_RULE, UNSUPPORTED_WORKLOAD_MSG))}

    api_version: str = Field(
        min_length=1, max_length=MAX_NAME,
        description=f"apiVersion of the workload; with kind, one of: {SUPPORTED_TEXT}.",
    )
    kind: str = Field(min_length=1, max_length=63, description="Kind of the workload, e.g. JobSet or TrainJob.")
    name: str = Field(
        min_length=1, max_length=MAX_NAME,
        description=(
            "Name of the workload in the RLJob's namespace. The job succeeds or fails when it does; until it "
            "exists, condition TrainerWorkload is False (TrainerWorkloadMissing)."
        ),
    )

    @model_validator(mode="after")
    def _followable(self) -> WorkloadRef:
        if workload_kind(self.api_version, self.kind) is None:
            raise ValueError(UNSUPPORTED_WORKLOAD_MSG)
        return self


TRAINER_EXCLUSIVE_MSG = (
    "spec.trainer.workloadRef and spec.trainer.command exclude each other: set workloadRef (you run the trainer) "
    "or command (the operator runs it), not both"
)


COLOCATE_REFUSED_MSG = (
    "spec.trainer.colocate is deprecated and refused: trainer and engine pods each request their GPUs "
    "exclusively, so they never share them and offloading the engines around training only stops their "
    "generation; leave the field out and give the trainer GPUs of its own (spec.trainer.gpusPerReplica). "
    "It is removed in rljob.io/v1alpha2 (rljob-operator 0.2.0)"
)


class TrainerSpec(ApiModel):
    """The trainer workload: pods the operator creates (torchrun-style env injected), or a reference to one you run."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("!(has(self.workloadRef) && has(self.command))", TRAINER_EXCLUSIVE_MSG, ".workloadRef"),
            ("!self.colocate", COLOCATE_REFUSED_MSG, ".colocate"),
            *cel_rules(OWNED["trainer"]),
            env_rule("trainer"),
        )
    }

    image: str = Field(default="ghcr.io/rljob/trainer:0.1.0", min_length=1, max_length=MAX_IMAGE, description="Trainer container image.")
    replicas: int = Field(default=1, ge=0, le=4096, description="Trainer pods (WORLD_SIZE). Can be changed live.")
    gpus_per_replica: int = Field(default=8, ge=0, le=64, description="GPUs of each trainer pod (0: CPU).")
    command: list[str] | None = Field(default=None, max_length=MAX_ARGS, description="Trainer command; defaults to the reference trainer.")
    args: list[str] = Field(default_factory=list, max_length=MAX_ARGS, description="Arguments appended to the command.")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description="Extra trainer environment (RANK, WORLD_SIZE, MASTER_ADDR... are injected).")
    resources: Resources = Field(default_factory=Resources, description="Trainer container resources besides GPUs.")
    placement: Placement = Field(default_factory=Placement, description="nodeSelector, tolerations, affinity, priorityClassName of trainer pods.")
    pod_metadata: PodMetadata = Field(default_factory=PodMetadata, description="Extra labels/annotations on trainer pods.")
    gpu_resource: str = Field(
        default=DEFAULT_GPU_RESOURCE, min_length=1, max_length=MAX_NAME, pattern=GPU_RESOURCE_PATTERN,
        description="Extended resource name of a GPU on your nodes, e.g. nvidia.com/gpu or amd.com/gpu.",
    )
    template: PodTemplate | None = Field(
        default=None,
        description=(
            "A pod template merged into the trainer pods the operator builds (volumes, sidecars, init containers, "
            "imagePullSecrets, securityContext, envFrom...); env, resources, placement and podMetadata are shorthands merged before it. "
            "Fields the operator owns are refused."
        ),
    )
    service_account_name: str | None = Field(default=None, max_length=MAX_NAME, description="ServiceAccount of trainer pods; it must be allowed `update` on rljobs/control.")
    colocate: bool = Field(
        default=False,
        description=(
            "Deprecated, and refused when true: it never made the trainer share the engines' GPUs (each pod "
            "requests its GPUs exclusively). Removed in rljob.io/v1alpha2 (rljob-operator 0.2.0)."
        ),
    )
    reference: ReferenceTrainerSpec = Field(default_factory=ReferenceTrainerSpec, description="Settings of the bundled reference trainer.")
    workload_ref: WorkloadRef | None = Field(default=None, description="A trainer workload you run yourself (then no trainer pods are created).")
    max_restarts: int = Field(
        default=3, ge=0, le=1000,
        description=(
            "Times the trainer pods are all recreated together after one of them fails, each time resuming from "
            "the newest checkpoint; when spent, the job fails (Failed/TrainerRestartBudgetExhausted). The "
            "reference trainer is restarted only with reference.saveEverySteps > 0 (else there is nothing to "
            "resume from and the job fails at once); a trainer command of your own is restarted and must resume "
            "by itself (0 turns restarts off)."
        ),
    )

    @property
    def uses_reference_trainer(self) -> bool:
        """True when the operator runs the bundled trainer (no command of your own, no workload of your own)."""
        return self.command is None and self.workload_ref is None

    @property
    def resumes(self) -> bool:
        """Whether a restarted trainer continues where it stopped: the reference trainer only from checkpoints."""
        return not self.uses_reference_trainer or self.reference.checkpoint_every > 0

    @model_validator(mode="after")
    def _one_trainer(self) -> TrainerSpec:
        if self.workload_ref is not None and self.command is not None:
            raise ValueError(TRAINER_EXCLUSIVE_MSG)
        if self.colocate:
            raise ValueError(COLOCATE_REFUSED_MSG)
        conflict = env_conflict("trainer", self.env) or template_conflict(OWNED["trainer"], self.template, self.gpu_resource)
        if conflict:
            raise ValueError(conflict)
        return self


GRPO_GROUP_MSG = (
    "spec.rollout.sampling.nSamplesPerPrompt must be at least 2 for the reference GRPO trainer "
    "(advantages are normalised within each prompt's group, a group of one never learns); "
    "or set spec.trainer.reference.algorithm: reinforce"
)
STALE_NEEDS_CORRECTION_MSG = (
    "spec.rollout.maxStaleness > 0 lets the reference trainer train on samples drawn under older weights, which "
    "needs an importance correction: set spec.trainer.reference.offPolicy.mode to tis or clip, "
    "or spec.rollout.maxStaleness: 0"
)
ROLLOUT_NEEDED_MSG = (
    "spec.rollout may be left out only with spec.trainer.workloadRef (you run the trainer and its generation): "
    "the operator's trainers, the reference trainer or spec.trainer.command, read their batches from the "
    "rollout executor that spec.rollout configures"
)
ROLLOUT_PRESENCE_IMMUTABLE_MSG = (
    "spec.rollout's presence is immutable: it decides whether the job has a rollout executor; "
    "create a new RLJob to add or remove it"
)


class RLJobSpec(ApiModel):
    """One RL post-training run: an engine fleet, a rollout executor and trainers."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("has(self.rollout) || has(self.trainer.workloadRef)", ROLLOUT_NEEDED_MSG, ".rollout"),
            ("has(self.rollout) == has(oldSelf.rollout)", ROLLOUT_PRESENCE_IMMUTABLE_MSG, ".rollout"),
            (
                "has(self.trainer.command) || has(self.trainer.workloadRef) || !has(self.rollout)"
                " || self.trainer.reference.algorithm != 'grpo' || self.rollout.sampling.nSamplesPerPrompt >= 2",
                GRPO_GROUP_MSG,
                ".rollout.sampling.nSamplesPerPrompt",
            ),
            (
                "has(self.trainer.command) || has(self.trainer.workloadRef) || !has(self.rollout)"
                " || self.rollout.maxStaleness == 0"
                " || self.trainer.reference.offPolicy.mode != 'none'",
                STALE_NEEDS_CORRECTION_MSG,
                ".trainer.reference.offPolicy.mode",
            ),
        )
    }

    model: ModelSpec = Field(description="The policy's initial weights. Immutable.")
    inference: InferenceSpec = Field(description="The inference engine fleet.")
    rollout: RolloutSpec | None = Field(
        default=None,
        description=(
            "The rollout executor: dataset, sampling, reward. Leave it out with spec.trainer.workloadRef when your "
            "trainer generates its own samples against the engines (the `<job>-engines` Service): the job is then "
            "the engine fleet and its weight-update coordination only, with no executor Deployment, Service or Ray. "
            "It cannot be added or removed later."
        ),
    )
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="The trainer workload.")
    suspend: bool = Field(default=False, description="Delete engine and trainer pods but keep the job (Kueue-compatible); false again recreates them.")
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, description="Delete the job this long after it Succeeded or Failed.")

    @model_validator(mode="after")
    def _coherent(self) -> RLJobSpec:
        if self.rollout is None:
            if self.trainer.workload_ref is None:
                raise ValueError(ROLLOUT_NEEDED_MSG)
            return self
        if (
            self.trainer.uses_reference_trainer
            and self.trainer.reference.algorithm == "grpo"
            and self.rollout.sampling.n_samples_per_prompt < 2
        ):
            raise ValueError(GRPO_GROUP_MSG)
        if (
            self.trainer.uses_reference_trainer
            and self.rollout.max_staleness > 0
            and self.trainer.reference.off_policy.mode is OffPolicyMode.none
        ):
            raise ValueError(STALE_NEEDS_CORRECTION_MSG)
        return self

    @property
    def overlaps_generation(self) -> bool:
        """The trainer generates rollout n+1 while it trains on n (miles train_async): when
        samples may lag a version and the engines stay up while the trainer trains (colocated
        engines are offloaded then). One rule for local mode and trainer pods."""
        colocated = self.trainer.colocate and self.inference.offload.enabled
        return self.rollout is not None and self.rollout.max_staleness >= 1 and not colocated

    @property
    def executor(self) -> RolloutSpec:
        """spec.rollout of a job that has an executor; what reads it (the executor's manifests and
        process, the operator's trainers) exists only then (`ROLLOUT_NEEDED_MSG`)."""
        if self.rollout is None:
            raise ValueError(ROLLOUT_NEEDED_MSG)
        return self.rollout

    def validate_update(self, old: RLJobSpec) -> None:
        """The CRD's transition rules (immutable fields) for callers without an API server.

        Raises ValueError with the same message the API server gives.
        """
        if self.model != old.model:
            raise ValueError(MODEL_IMMUTABLE_MSG)
        if self.inference.engine != old.inference.engine:
            raise ValueError(ENGINE_IMMUTABLE_MSG)
        if self.inference.gpus_per_engine != old.inference.gpus_per_engine:
            raise ValueError(GPUS_PER_ENGINE_IMMUTABLE_MSG)
        if self.inference.gpus_per_node != old.inference.gpus_per_node:
            raise ValueError(GPUS_PER_NODE_IMMUTABLE_MSG)
        if self.inference.port != old.inference.port:
            raise ValueError(PORT_IMMUTABLE_MSG)
        if self.inference.weight_update.method != old.inference.weight_update.method:
            raise ValueError(WEIGHT_METHOD_IMMUTABLE_MSG)
        if self.inference.weight_update.shared_path != old.inference.weight_update.shared_path:
            raise ValueError(SHARED_PATH_IMMUTABLE_MSG)
        if (self.rollout is None) != (old.rollout is None):
            raise ValueError(ROLLOUT_PRESENCE_IMMUTABLE_MSG)


class RLJobManifest(ApiModel):
    """A whole RLJob object as written in a manifest (local mode reads these)."""

    model_config = ApiModel.model_config | {"extra": "ignore"}

    api_version: Literal["rljob.io/v1alpha1"] = "rljob.io/v1alpha1"
    kind: Literal["RLJob"] = "RLJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RLJobSpec
