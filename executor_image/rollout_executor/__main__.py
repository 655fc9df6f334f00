"""The executor process: a Ray head (or a join), the job's named detached actor, then wait.

    python -m rollout_executor --job NAME --manifest rljob.yaml [--dataset PATH] [--namespace NS]
        (--controller-url URL | --engines-url URL | --router-url URL | --endpoint URL ...)
        [--ray-address HOST:PORT] [--node-ip IP] [--client-port 10001] [--data-port 10002]
        [--state-dir DIR] [--ready-file FILE] [--exit-with-parent]

When ready it prints one JSON line `{"event": "ready", ...}` (actor name, Ray addresses, data
channel URL) and writes the same to --ready-file; it stays up until SIGTERM/SIGINT (or, with
--exit-with-parent, until the process that started it is gone), then kills the actor and stops
the Ray head it started. Exit code 2: bad configuration (missing dataset, unknown reward
function), with a message naming the spec field.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from controller_runtime.api.spec import RLJobManifest
from rollout_executor.config import ACTOR_NAMESPACE, EngineSource, ExecutorConfig, actor_name
from rollout_executor.dataset import DatasetError, PromptDataset
from rollout_executor.rewards import RewardError, load_reward

log = logging.getLogger("rollout_executor")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rollout_executor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True, help="RLJob name (actor rljob-executor-<job>).")
    p.add_argument("--namespace", default=os.environ.get("RLJOB_NAMESPACE", "default"), help="RLJob namespace (controller API).")
    p.add_argument("--manifest", default=os.environ.get("RLJOB_MANIFEST"), help="RLJob manifest (YAML) whose spec.rollout drives the executor ($RLJOB_MANIFEST).")
    p.add_argument("--dataset", help="Override spec.rollout.dataset.path (the path inside this pod).")
    src = p.add_argument_group("engines (first given wins)")
    src.add_argument("--endpoint", action="append", default=[], help="A fixed engine base URL (repeatable).")
    src.add_argument("--router-url", help="A router that spreads requests itself.")
    src.add_argument("--controller-url", help="The operator's controller API base URL (cells.servingEndpoints).")
    src.add_argument("--engines-url", help="The <job>-engines Service URL.")
    src.add_argument("--token-path", help="Bearer token file for the controller API (default: the pod's ServiceAccount token).")
    ray_g = p.add_argument_group("ray")
    ray_g.add_argument("--ray-address", help="Join this Ray cluster (GCS host:port) instead of starting a head.")
    ray_g.add_argument("--ray-connect-timeout", type=float, default=300.0,
                       help="With --ray-address: keep retrying the connection this long (s) while that cluster's head starts.")
    ray_g.add_argument("--node-ip", default=os.environ.get("POD_IP", "127.0.0.1"), help="Address of the head this process starts.")
    ray_g.add_argument("--client-port", type=int, default=10001, help="Ray Client server port.")
    ray_g.add_argument("--gcs-port", type=int, default=6379)
    ray_g.add_argument("--num-cpus", type=int, default=2)
    ray_g.add_argument("--object-store-bytes", type=int, default=500 * 1024 * 1024)
    ray_g.add_argument("--ray-temp-dir", help="Ray's temp dir (short path).")
    p.add_argument("--data-host", default=None, help="Bind address of the shard side channel (default: the node IP; all interfaces with --ray-address).")
    p.add_argument("--data-port", type=int, default=10002, help="Port of the shard side channel (0: any).")
    p.add_argument("--data-advertise-host", default=None, help="Host trainers use to reach the side channel.")
    p.add_argument("--state-dir", default=os.environ.get("RLJOB_EXECUTOR_STATE_DIR"), help="Where save/load keep the dataset position.")
    p.add_argument("--ready-file", help="Write the ready JSON here.")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="Stop once the process that started this one is gone (`rljob run` passes it; an executor "
                        "pod's process outlives its kubelet, as containers do).")
    return p.parse_args(argv)


EXECUTOR_SPEC_ENV = "RLJOB_EXECUTOR_SPEC"  # set by rljob_operator.manifests.executor


def load_manifest(args: argparse.Namespace) -> RLJobManifest:
    """The RLJob from --manifest; without one, a spec from the environment the operator sets
    (RLJOB_MODEL_PATH, RLJOB_TOKENIZER_PATH) and --dataset, with default sampling and reward."""
    if args.manifest:
        data = yaml.safe_load(Path(args.manifest).read_text())
    elif os.environ.get(EXECUTOR_SPEC_ENV):
        # The operator's Deployment: the executor's part of the RLJob spec as JSON.
        data = {"spec": json.loads(os.environ[EXECUTOR_SPEC_ENV])}
    else:
        if not args.dataset:
            raise SystemExit("rollout_executor: give --manifest (the RLJob) or at least --dataset")
        log.warning("no --manifest: default sampling, reward and batch size; mount the RLJob and pass --manifest")
        model = {"path": os.environ.get("RLJOB_MODEL_PATH", "/models")}
        if os.environ.get("RLJOB_TOKENIZER_PATH"):
            model["tokenizer"] = os.environ["RLJOB_TOKENIZER_PATH"]
        data = {"spec": {"model": model, "inference": {}, "rollout": {"dataset": {"path": args.dataset}}}}
    if args.dataset:
        data.setdefault("spec", {}).setdefault("rollout", {}).setdefault("dataset", {})["path"] = args.dataset
    return RLJobManifest.model_validate(data)


def default_data_host(args: argparse.Namespace) -> str:
    """Bind address of the shard side channel when --data-host is not given.

    The channel is served by the actor, and the actor runs where Ray places it. With a head of
    our own that is this pod: its node IP. Joining a cluster (--ray-address, e.g. a KubeRay
    RayCluster) it runs on one of that cluster's nodes, where this pod's IP is no local
    address: bind every interface there, and the actor advertises its node's IP.
    """
    if args.ray_address:
        return "0.0.0.0"
    return "127.0.0.1" if args.node_ip in ("127.0.0.1", "localhost") else str(args.node_ip)


def build_config(args: argparse.Namespace, manifest: RLJobManifest, data_host: str) -> ExecutorConfig:
    engines = EngineSource(
        endpoints=tuple(args.endpoint),
        router_url=args.router_url,
        controller_url=args.controller_url,
        engines_url=args.engines_url,
        namespace=args.namespace,
        token_path=args.token_path,
    )
    if not (engines.endpoints or engines.router_url or engines.controller_url or engines.engines_url):
        if manifest.spec.inference.router is None:
            raise SystemExit("rollout_executor: give --controller-url, --engines-url, --router-url or --endpoint")
        engines = EngineSource(router_url=manifest.spec.inference.router.url)
    return ExecutorConfig.from_spec(
        args.job,
        manifest.spec,
        engines=engines,
        state_dir=args.state_dir,
        data_host=data_host,
        data_port=args.data_port,
        data_advertise_host=args.data_advertise_host,
    )


def orphaned(parent_pid: int) -> bool:
    """True once the process that started us is gone (we were re-parented).

    The backstop behind PR_SET_PDEATHSIG for `--exit-with-parent` (`rljob run` starts the
    executor with both): a SIGKILLed runner is meant to SIGTERM us, but once in CI
    (test_local_run) that SIGTERM never stopped the executor, which went on serving its Ray head
    for minutes. The main loop asks every second, so the executor, its actor and its Ray head go
    within a second or two of the runner whatever became of the signal. A parent of pid 0 or 1
    (a container's init) is never "gone".
    """
    return parent_pid > 1 and os.getppid() != parent_pid


def check_config(config: ExecutorConfig) -> None:
    """Fail at start, naming the spec field, rather than in the first rollout."""
    PromptDataset.from_path(config.dataset_path, config.dataset_format, messages_field=config.messages_field,
                            prompt_field=config.prompt_field, label_field=config.label_field)
    load_reward(config.reward_function)
    if config.rollout_function:
        load_reward(config.rollout_function, "spec.rollout.function")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    manifest = load_manifest(args)
    node_ip = args.node_ip
    data_host = args.data_host or default_data_host(args)
    try:
        config = build_config(args, manifest, data_host)
        check_config(config)
    except (DatasetError, RewardError) as e:
        print(f"rollout_executor: {e}", file=sys.stderr)
        return 2

    stop = threading.Event()
    parent_pid = os.getppid() if args.exit_with_parent else 0

    def on_signal() -> None:
        # ray.init installs its own SIGTERM handler (it aborts the process): ours goes back on after.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())

    on_signal()

    import ray
    from rljob_client.rayconnect import init_ray

    from rollout_executor.actor import create_actor
    from rollout_executor.rayhead import start_ray_head

    head = None
    if args.ray_address:
        address = args.ray_address
    else:
        head = start_ray_head(
            node_ip=node_ip,
            client_port=args.client_port,
            gcs_port=args.gcs_port,
            num_cpus=args.num_cpus,
            object_store_bytes=args.object_store_bytes,
            temp_dir=args.ray_temp_dir,
        )
        address = head.address
    handle = None
    try:
        if head is None:  # a cluster we did not start (a KubeRay RayCluster): it may not be up yet
            init_ray(address, ACTOR_NAMESPACE, time.monotonic() + args.ray_connect_timeout)
        else:
            ray.init(address=address, namespace=ACTOR_NAMESPACE, logging_level=logging.WARNING)
        on_signal()
        handle, info = create_actor(config)
        resumed = ray.get(handle.load.remote()) if config.state_dir else None
        ready: dict[str, Any] = {
            "event": "ready",
            "job": config.job,
            "actor": actor_name(config.job),
            "namespace": ACTOR_NAMESPACE,
            "ray_address": address,
            "client_address": head.client_address if head else None,
            "data_url": info["data_url"],
            "resumed_from_rollout": resumed,
        }
        line = json.dumps(ready)
        print(line, flush=True)
        if args.ready_file:
            Path(args.ready_file).write_text(line + "\n")
        while not stop.wait(1.0):
            if head is not None and not head.alive():
                log.error("the Ray head exited:\n%s", head.log_tail())
                return 1
            if orphaned(parent_pid):
                log.warning("the process that started the executor (pid %d) is gone", parent_pid)
                break
        log.info("stopping")
        return 0
    finally:
        if handle is not None:
            try:
                ray.get(handle.shutdown.remote(), timeout=10)
                ray.kill(handle, no_restart=True)
            except Exception as e:
                log.warning("actor shutdown: %s", e)
        if ray.is_initialized():
            ray.shutdown()
        if head is not None:
            head.stop()


if __name__ == "__main__":
    sys.exit(main())
