"""The user's intent: `RLJob.spec`.

These models are the one source of truth for the CRD (`crds/rljob.yaml` is generated from
them), for local mode's manifest parsing and for the reconciler. Descriptions are written
for the person reading `kubectl explain rlj.spec...` and the generated reference.
Cross-field rules that the API server must enforce are attached as CEL rules
(`x-kubernetes-validations`) and mirrored by pydantic validators so that local mode rejects
the same manifests with the same messages.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, model_validator

from controller_runtime.api.base import ApiModel

CEL = "x-kubernetes-validations"


def cel(*rules: tuple[str, str] | tuple[str, str, str]) -> dict[str, Any]:
    """json_schema_extra carrying CEL rules: (rule, message[, fieldPath])."""
    out = []
    for r in rules:
        item = {"rule": r[0], "message": r[1]}
        if len(r) > 2:
            item["fieldPath"] = r[2]
        out.append(item)
    return {CEL: out}


class Engine(StrEnum):
    vllm = "vllm"
    sglang = "sglang"


class MemoryTag(StrEnum):
    """What an engine can release and take back (miles' offload levels)."""

    weights = "weights"
    kv_cache = "kv_cache"
    cuda_graph = "cuda_graph"


class PvcSource(ApiModel):
    claim_name: str = Field(min_length=1, description="PersistentVolumeClaim holding the weights.")
    sub_path: str = Field("", description="Path inside the claim.")


class ModelSpec(ApiModel):
    """Where the policy's initial weights live. Mounted read-only into engines and trainers."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("has(self.path) || has(self.pvc)", "spec.model: set path or pvc (where the weights are)"),
            ("self == oldSelf", "spec.model is immutable; create a new RLJob to change the model"),
        )
    }

    path: str | None = Field(None, description="Path to a HuggingFace-format model directory (local mode, or a hostPath/volume path).")
    pvc: PvcSource | None = Field(None, description="PVC holding the model; mounted at /models in engine and trainer pods.")
    tokenizer: str | None = Field(None, description="Tokenizer directory; defaults to the model directory.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.path is None and self.pvc is None:
            raise ValueError("spec.model: set path or pvc (where the weights are)")
        return self


class HealthCheckSpec(ApiModel):
    """Engine health probing (miles' rollout health check). Failures are consecutive; one success resets."""

    interval_seconds: float = Field(30, gt=0, description="Seconds between probes of one cell.")
    timeout_seconds: float = Field(30, gt=0, description="A probe not answered within this many seconds is a failure.")
    failure_threshold: int = Field(3, ge=1, description="Consecutive failed probes that make a cell Unhealthy.")
    initial_delay_seconds: float = Field(0, ge=0, description="Grace period after start and after every resume before the first probe counts.")
    startup_deadline_seconds: float = Field(1800, gt=0, description="A cell still starting after this long is Unhealthy (StartupDeadlineExceeded).")


class RestartPolicySpec(ApiModel):
    """A restart budget: never an unbounded crash loop."""

    backoff_seconds: float = Field(5, ge=0, description="First delay before recreating an unhealthy cell; doubles after each failed restart.")
    max_backoff_seconds: float = Field(300, ge=0, description="Upper bound of the restart delay.")
    max_restarts: int = Field(5, ge=0, description="Recreations allowed per cell; when spent, the job reports EnginesHealthy=False/RestartBudgetExhausted.")


class OffloadSpec(ApiModel):
    """Release engine GPU memory while the trainer runs on the same GPUs (colocated mode)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(("!self.enabled || size(self.tags) > 0", "spec.inference.offload.tags must name at least one of weights, kv_cache, cuda_graph when offload is enabled")),
    }

    enabled: bool = Field(False, description="Offload engines around each training step.")
    tags: list[MemoryTag] = Field(
        default_factory=lambda: [MemoryTag.weights, MemoryTag.kv_cache, MemoryTag.cuda_graph],
        max_length=3,
        description="What to release: weights, kv_cache, cuda_graph.",
    )


class RouterSpec(ApiModel):
    url: str = Field(min_length=1, description="Base URL of an external router (e.g. sglang-router); serving cells are registered with it.")


class EvalFleetSpec(ApiModel):
    """A frozen fleet pinned to a checkpoint, used for evaluation only."""

    replicas: int = Field(1, ge=1, description="Eval cells.")
    checkpoint: str = Field(min_length=1, description="Weights directory the eval fleet is pinned to.")
    weight_version: str = Field(min_length=1, description="Version every eval engine must report before eval runs.")


class WeightUpdateMethod(StrEnum):
    disk = "disk"
    nccl = "nccl"


class PauseMode(StrEnum):
    abort = "abort"
    wait = "wait"
    keep = "keep"


class WeightUpdateSpec(ApiModel):
    method: WeightUpdateMethod = Field(WeightUpdateMethod.disk, description="disk: safetensors on shared storage + engine reload; nccl: broadcast into a process group.")
    pause_mode: PauseMode = Field(PauseMode.wait, description="How in-flight requests are treated while weights change (vLLM /pause?mode=).")
    check_weights: bool = Field(False, description="Snapshot engine weight checksums before, compare after (miles check_weight_update_equal).")
    lock_timeout_seconds: float = Field(600, gt=0, description="An update window left open longer than this is aborted and reported.")
    shared_path: str = Field("/checkpoints", description="Shared directory where the trainer writes weights for disk updates.")


class Toleration(ApiModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(ApiModel):
    name: str = Field(min_length=1)
    value: str = ""


class Resources(ApiModel):
    """Container resources, Kubernetes quantities as strings."""

    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)


class PodMetadata(ApiModel):
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the pods.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations on the pods.")


class Placement(ApiModel):
    """Where pods may run. Fields mirror the Pod spec."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] | None = Field(None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"})
    priority_class_name: str | None = None


class InferenceSpec(ApiModel):
    """The engine fleet: `replicas` cells of `gpusPerEngine` GPUs; a cell spans ceil(gpusPerEngine/gpusPerNode) pods."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            (
                "self.gpusPerEngine <= self.gpusPerNode || self.gpusPerEngine % self.gpusPerNode == 0",
                "spec.inference.gpusPerEngine must be a multiple of spec.inference.gpusPerNode when it is larger (a cell spans whole nodes); use e.g. 8, 16 or 24 GPUs with 8 per node",
                ".gpusPerEngine",
            ),
            ("self.engine == oldSelf.engine", "spec.inference.engine is immutable; create a new RLJob to switch engines", ".engine"),
            ("self.gpusPerEngine == oldSelf.gpusPerEngine", "spec.inference.gpusPerEngine is immutable; create a new RLJob to change the cell shape", ".gpusPerEngine"),
            ("self.gpusPerNode == oldSelf.gpusPerNode", "spec.inference.gpusPerNode is immutable; create a new RLJob to change the cell shape", ".gpusPerNode"),
        )
    }

    engine: Engine = Field(Engine.vllm, description="Inference engine: vllm or sglang.")
    image: str = Field("vllm/vllm-openai:v0.32.0", min_length=1, description="Engine container image.")
    replicas: int = Field(1, ge=0, le=1024, description="Number of engine cells (data-parallel engines). Can be changed live.")
    gpus_per_engine: int = Field(1, ge=0, le=512, description="GPUs of one engine (tensor x pipeline parallel). 0 runs on CPU (local mode, tests).")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per node; a cell spans ceil(gpusPerEngine/gpusPerNode) pods.")
    tensor_parallel_size: int | None = Field(None, ge=1, description="Defaults to min(gpusPerEngine, gpusPerNode).")
    pipeline_parallel_size: int | None = Field(None, ge=1, description="Defaults to the number of pods in a cell.")
    port: int = Field(8000, ge=1, le=65535, description="Engine HTTP port.")
    engine_args: list[str] = Field(default_factory=list, description="Extra engine command-line arguments.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra engine environment.")
    resources: Resources = Field(default_factory=Resources, description="Engine container resources besides GPUs (GPUs come from gpusPerEngine).")
    placement: Placement = Field(default_factory=Placement, description="nodeSelector, tolerations, affinity, priorityClassName of engine pods.")
    pod_metadata: PodMetadata = Field(default_factory=PodMetadata, description="Extra labels/annotations on engine pods.")
    health_check: HealthCheckSpec = Field(default_factory=HealthCheckSpec)
    restart_policy: RestartPolicySpec = Field(default_factory=RestartPolicySpec)
    offload: OffloadSpec = Field(default_factory=OffloadSpec)
    weight_update: WeightUpdateSpec = Field(default_factory=WeightUpdateSpec)
    router: RouterSpec | None = Field(None, description="Optional external router; absent means clients use the <job>-engines Service.")
    eval: EvalFleetSpec | None = Field(None, description="Optional eval fleet pinned to a checkpoint.")

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
        if self.gpus_per_engine > self.gpus_per_node and self.gpus_per_engine % self.gpus_per_node:
            raise ValueError(
                "spec.inference.gpusPerEngine must be a multiple of spec.inference.gpusPerNode when it is larger "
                f"(got {self.gpus_per_engine} and {self.gpus_per_node})"
            )
        if self.offload.enabled and not self.offload.tags:
            raise ValueError("spec.inference.offload.tags must name at least one of weights, kv_cache, cuda_graph")
        return self


class DatasetFormat(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"


class DatasetSpec(ApiModel):
    path: str = Field(min_length=1, description="JSONL or Parquet file of prompts (a path inside the executor pod, or local path in local mode).")
    format: DatasetFormat | None = Field(None, description="Defaults to the file extension.")
    prompt_field: str = Field("prompt", description="Field holding the prompt text.")
    label_field: str | None = Field("label", description="Field handed to the reward function as the reference answer.")
    shuffle: bool = Field(True, description="Shuffle deterministically each epoch.")
    seed: int = Field(0, description="Seed of the shuffle; the position is saved so a restart resumes.")


class SamplingSpec(ApiModel):
    n_samples_per_prompt: int = Field(8, ge=1, le=1024, description="Samples per prompt (one GRPO group).")
    max_tokens: int = Field(64, ge=1, description="New tokens per sample.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")


class RewardSpec(ApiModel):
    function: str = Field(
        "rollout_executor.rewards:exact_match",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Import path `module:function` of the reward; built-ins in rollout_executor.rewards: exact_match, regex_match, math_answer, token_set_fraction.",
    )
    args: dict[str, Any] = Field(default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"}, description="Keyword arguments for the reward function.")


class OnWeightUpdate(StrEnum):
    drain = "drain"
    abort = "abort"


class RayClusterSpec(ApiModel):
    """Run the executor's Ray on a KubeRay RayCluster instead of inside the executor pod."""

    ray_version: str = Field("2.60.0", description="Ray version of the RayCluster.")
    image: str = Field("rayproject/ray:2.60.0", description="Ray image.")
    workers: int = Field(0, ge=0, description="CPU worker replicas.")


class RolloutSpec(ApiModel):
    image: str = Field("ghcr.io/rljob/rollout-executor:0.1.0", min_length=1, description="RolloutExecutor image.")
    resources: Resources = Field(default_factory=Resources)
    dataset: DatasetSpec
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    batch_size: int = Field(8, ge=1, description="Prompts per rollout (samples per rollout = batchSize x nSamplesPerPrompt).")
    max_staleness: int = Field(1, ge=0, description="How many weight versions a sample may lag behind the current version when handed to a trainer.")
    concurrency: int = Field(16, ge=1, description="In-flight generation requests per engine.")
    on_weight_update: OnWeightUpdate = Field(OnWeightUpdate.drain, description="drain: finish in-flight requests first; abort: abort and retry them on the new weights.")
    ray_cluster: RayClusterSpec | None = Field(None, description="Optional KubeRay RayCluster for the executor.")


class ReferenceTrainerSpec(ApiModel):
    """The bundled torch trainer (GRPO/REINFORCE)."""

    steps: int = Field(50, ge=1, description="Training steps (one rollout each).")
    learning_rate: float = Field(1e-3, gt=0)
    algorithm: Literal["grpo", "reinforce"] = "grpo"
    save_every: int = Field(0, ge=0, description="Checkpoint every N steps (0: only weight-sync files).")


class WorkloadRef(ApiModel):
    api_version: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)


class TrainerSpec(ApiModel):
    """The trainer workload: pods the operator creates (torchrun-style env injected), or a reference to one you run."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": cel(
            ("!(has(self.workloadRef) && has(self.command))", "spec.trainer: set either workloadRef (you run the trainer) or command/image (the operator runs it), not both"),
        )
    }

    image: str = Field("ghcr.io/rljob/trainer:0.1.0", min_length=1)
    replicas: int = Field(1, ge=0, le=4096, description="Trainer pods (WORLD_SIZE). Can be changed live.")
    gpus_per_replica: int = Field(8, ge=0, le=64)
    command: list[str] | None = Field(None, description="Trainer command; defaults to the reference trainer.")
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)
    pod_metadata: PodMetadata = Field(default_factory=PodMetadata)
    service_account_name: str | None = Field(None, description="ServiceAccount of trainer pods; it must be allowed `update` on rljobs/control.")
    colocate: bool = Field(False, description="Trainer shares GPUs with engines (offload engines during training).")
    reference: ReferenceTrainerSpec = Field(default_factory=ReferenceTrainerSpec)
    workload_ref: WorkloadRef | None = Field(None, description="A trainer workload you run yourself (then no trainer pods are created).")


class RLJobSpec(ApiModel):
    model: ModelSpec
    inference: InferenceSpec
    rollout: RolloutSpec
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    suspend: bool = Field(False, description="Delete engine and trainer pods but keep the job (Kueue-compatible); false again recreates them.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Delete the job this long after it Succeeded or Failed.")


class RLJobManifest(ApiModel):
    """A whole RLJob object as written in a manifest (local mode reads these)."""

    model_config = ApiModel.model_config | {"extra": "ignore"}

    api_version: Literal["rljob.io/v1alpha1"] = "rljob.io/v1alpha1"
    kind: Literal["RLJob"] = "RLJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RLJobSpec
