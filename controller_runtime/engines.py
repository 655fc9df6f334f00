"""The engines and weight-sync methods the controller knows, as two tables.

Everything that differs between engines or between methods is a field of a descriptor here;
the manifest builders and the engine clients' factory read the tables and never branch on a
name, and the spec admits the engines of the table and no other. An engine without a descriptor has no client and no argv, and the
spec refuses it (the CRD's enum of `spec.inference.engine` is generated from `ENGINES`), so no
engine is ever run with another engine's client or command line.

Add an engine: its client (`clients/<engine>.py`), its argv builder and `EngineDescriptor`
row here, its member in `api.spec.Engine`; then regenerate the CRD (docs/design.md).
Add a weight-sync method: its `WeightSyncMethod` row here and its member in
`api.spec.WeightUpdateMethod`, its trainer-side transport; then regenerate the CRD.
"""

from __future__ import annotations

import importlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.spec import Engine, InferenceSpec, WeightUpdateMethod
from controller_runtime.engine_extensions import VLLM_LOGPROBS_ARGS, WEIGHT_TRANSFER_EXTENSION
from controller_runtime.ports import EngineClient


class UnknownEngine(ValueError):
    """A name with no row in `ENGINES` (the spec refuses it before this is ever raised)."""


# -- weight-sync methods ----------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSyncMethod:
    """How new weights travel from the trainer to the engines.

    `transport`: the trainer's side (`disk`: files the engines reload; `broadcast`: a process
    group of the window's engines); `backend`: the torch.distributed backend of a broadcast;
    `engine_extension`: the engine must load rljob_client's worker extension to receive it;
    `shared_storage`: trainer and engines must see one filesystem; `gpus`: GPU engines only."""

    name: str
    transport: str
    backend: str | None = None
    engine_extension: bool = False
    shared_storage: bool = False
    gpus: bool = False


WEIGHT_SYNC: dict[str, WeightSyncMethod] = {
    m.name: m
    for m in (
        WeightSyncMethod(WeightUpdateMethod.disk, "disk", shared_storage=True),
        WeightSyncMethod(WeightUpdateMethod.nccl, "broadcast", "nccl", engine_extension=True, gpus=True),
        WeightSyncMethod(WeightUpdateMethod.gloo, "broadcast", "gloo", engine_extension=True),
    )
}


def weight_sync(name: str) -> WeightSyncMethod:
    return WEIGHT_SYNC[name]


# -- what an argv builder is given ------------------------------------------------------------


@dataclass(frozen=True)
class EngineLaunch:
    """One engine pod as its argv builder sees it: the fleet's spec, the model's path inside the
    pod, which pod of the cell this is, and the DNS name of the cell's pod 0."""

    inference: InferenceSpec
    model: str
    tokenizer: str | None
    pod_index: int
    head: str

    @property
    def parallel(self) -> tuple[int, int]:
        return parallel_sizes(self.inference)


def parallel_sizes(inference: InferenceSpec) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes: TP within a pod, PP across the pods of a cell, unless set."""
    tp = inference.tensor_parallel_size or max(1, inference.gpus_per_pod)
    pp = inference.pipeline_parallel_size or inference.pods_per_cell
    return tp, pp


ClientFactory = Callable[..., EngineClient]  # (endpoint, *, timeout, session) -> client


def _load(path: str) -> ClientFactory:
    module, _, name = path.partition(":")
    factory: ClientFactory = getattr(importlib.import_module(module), name)
    return factory


@dataclass(frozen=True)
class EngineDescriptor:
    """One engine. `client`: its client class, or its "module:Class" (loaded when a client is
    made, so that the pure manifest builders that read this table import no HTTP library);
    `argv`: the command of one pod; `env`: (name, value) pairs every pod gets;
    `health_route`: what the pod's readinessProbe asks; `dist_init`: (port name, port) pod 0 of
    a multi-pod cell listens on for the others to join; `weight_methods`: the weight-sync
    methods it can receive; `offload`: whether it can release and take back memory."""

    name: str
    client: str | ClientFactory
    argv: Callable[[EngineLaunch], list[str]]
    env: tuple[tuple[str, str], ...] = ()
    health_route: str = "/health"
    dist_init: tuple[str, int] | None = None
    weight_methods: frozenset[str] = frozenset(WEIGHT_SYNC)
    offload: bool = True

    def make_client(self, endpoint: str, **options: Any) -> EngineClient:
        """A client of the engine at `endpoint` (`options`: the client's, e.g. timeout, session)."""
        factory = _load(self.client) if isinstance(self.client, str) else self.client
        return factory(endpoint, **options)


# -- vLLM -------------------------------------------------------------------------------------

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
RAY_GCS_PORT = 6379


def _vllm_server_args(launch: EngineLaunch, distributed: bool) -> list[str]:
    inf = launch.inference
    tp, pp = launch.parallel
    method = weight_sync(inf.weight_update.method)
    args = [
        "--model", launch.model,
        "--host", "$(POD_IP)",
        "--port", str(inf.port),
        *VLLM_LOGPROBS_ARGS,
        "--tensor-parallel-size", str(tp),
        "--pipeline-parallel-size", str(pp),
    ]  # fmt: skip
    if launch.tokenizer:
        args += ["--tokenizer", launch.tokenizer]
    if distributed:
        args += ["--distributed-executor-backend", "ray"]
    if inf.offload.enabled:
        args.append("--enable-sleep-mode")
    if method.backend == "nccl":
        args += ["--weight-transfer-config", json.dumps({"backend": "nccl"}, separators=(",", ":"))]
    if method.engine_extension or inf.gpus_per_engine == 0:
        # the trainer's broadcast lands in rljob_client's worker extension (the engine image must
        # ship it); a CPU engine loads it for every method: it asks for the AMX state vLLM's CPU
        # attention needs (`vllm_worker_extension.allow_amx`), and CPU engines run our image
        args += ["--worker-extension-cls", WEIGHT_TRANSFER_EXTENSION]
    return args + list(inf.engine_args)


def vllm_argv(launch: EngineLaunch) -> list[str]:
    """One pod: the server alone, or (multi-pod) a Ray head that waits for its workers, or a worker."""
    pods = launch.inference.pods_per_cell
    if pods == 1:
        return ["python", "-m", VLLM_MODULE, *_vllm_server_args(launch, distributed=False)]
    head = launch.head
    if launch.pod_index == 0:
        wait_for_workers = (
            'import ray, sys; ray.init(address="auto", logging_level="ERROR"); '
            f'sys.exit(0 if sum(n["Alive"] for n in ray.nodes()) >= {pods} else 1)'
        )
        server = shlex.join(["python", "-m", VLLM_MODULE, *_vllm_server_args(launch, distributed=True)])
        script = (
            "set -e\n"
            f"ray start --head --port={RAY_GCS_PORT} --node-ip-address=$(POD_IP) --disable-usage-stats\n"
            f"until python -c {shlex.quote(wait_for_workers)}; do sleep 5; done\n"
            f"exec {server}\n"
        )
    else:
        wait_for_head = f"import socket; socket.create_connection(({json.dumps(head)}, {RAY_GCS_PORT}), 5)"
        script = (
            f"until python -c {shlex.quote(wait_for_head)}; do sleep 5; done\n"
            f"exec ray start --address={head}:{RAY_GCS_PORT} --node-ip-address=$(POD_IP) "
            "--disable-usage-stats --block\n"
        )
    return ["bash", "-c", script]


# -- SGLang -----------------------------------------------------------------------------------

SGLANG_MODULE = "sglang.launch_server"
SGLANG_DIST_PORT = 50000


def sglang_argv(launch: EngineLaunch) -> list[str]:
    """Every pod runs the server; the pods of a multi-pod cell meet at pod 0's dist-init port."""
    inf = launch.inference
    tp, pp = launch.parallel
    args = [
        "python", "-m", SGLANG_MODULE,
        "--model-path", launch.model,
        "--host", "$(POD_IP)",
        "--port", str(inf.port),
        "--tp", str(tp),
    ]  # fmt: skip
    if pp > 1:
        args += ["--pp-size", str(pp)]
    if inf.pods_per_cell > 1:
        args += [
            "--nnodes", str(inf.pods_per_cell),
            "--node-rank", str(launch.pod_index),
            "--dist-init-addr", f"{launch.head}:{SGLANG_DIST_PORT}",
        ]  # fmt: skip
    if launch.tokenizer:
        args += ["--tokenizer-path", launch.tokenizer]
    if inf.offload.enabled:
        args.append("--enable-memory-saver")
    return args + list(inf.engine_args)


# -- the table --------------------------------------------------------------------------------

ENGINES: dict[str, EngineDescriptor] = {}


def register_engine(descriptor: EngineDescriptor) -> EngineDescriptor:
    """Add (or replace) an engine's row: from then on the spec admits its name."""
    ENGINES[str(descriptor.name)] = descriptor
    return descriptor


def unregister_engine(name: str) -> None:
    ENGINES.pop(name, None)


def engine(name: str) -> EngineDescriptor:
    """The row of `name`; an engine without one is refused, never run as another engine."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"spec.inference.engine: unknown engine {name!r}; one of {sorted(ENGINES)}") from None


register_engine(EngineDescriptor(
    Engine.vllm, "controller_runtime.clients.vllm:VLLMClient", vllm_argv,
    # dev mode: sleep/wake, pause/resume, collective_rpc and the weight routes the controller drives
    env=(("VLLM_SERVER_DEV_MODE", "1"), ("VLLM_HOST_IP", "$(POD_IP)")),
    dist_init=("ray-gcs", RAY_GCS_PORT),
))
register_engine(EngineDescriptor(
    Engine.sglang, "controller_runtime.clients.sglang:SGLangClient", sglang_argv,
    dist_init=("dist-init", SGLANG_DIST_PORT),
))
