"""The executor's Ray head refuses whoever lacks the job's token (CVE-2023-48022, "ShadowRay").

Fault: a caller that reaches the Ray Client port or GCS without the token (or with another
one). Expectation: refused with gRPC UNAUTHENTICATED before any code runs; the trainer's path
(Ray Client with `RAY_AUTH_MODE=token` and the token, as its pod gets them from the Secret)
runs a task. The raw gRPC probes run in this process (they never touch Ray's process-wide
auth state); the Ray Client drivers run as subprocesses with exactly a pod's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc, ray_client_pb2, ray_client_pb2_grpc
from rollout_executor.rayhead import RayHead, start_ray_head

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

TOKEN = "job-a-ray-token-0123456789abcdef"
# argv: address, then "once" (a refused caller: one try) or "retry" (the trainer's own connect,
# `rljob_client.rayconnect`, which retries the Ray Client server's per-connection start-up: on a
# busy machine it can miss the 1 s initial timeout and answer "Initialization failure").
DRIVER = """
import sys, time, ray
from rljob_client.rayconnect import init_ray
try:
    if sys.argv[2] == "retry":
        init_ray(sys.argv[1], "rljob-auth-test", time.monotonic() + 60)
    else:
        ray.init(sys.argv[1], logging_level="ERROR")
except ConnectionError as e:
    print("REFUSED", e)
else:
    print("RAN", ray.get(ray.remote(lambda: 41 + 1).remote()))
"""


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    h = start_ray_head(num_cpus=1, object_store_bytes=100 * 2**20, auth_token=TOKEN)
    yield h
    h.stop()


def client_target(head: RayHead) -> str:
    return f"127.0.0.1:{head.client_port}"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def client_ping(head: RayHead, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    with grpc.insecure_channel(client_target(head)) as ch:
        stub = ray_client_pb2_grpc.RayletDriverStub(ch)
        req = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
        try:
            stub.ClusterInfo(req, timeout=20, metadata=metadata)
        except grpc.RpcError as e:
            assert e.code() != grpc.StatusCode.UNAUTHENTICATED or "authentication token" in (
                e.details() or ""
            )
            return e.code()
        return grpc.StatusCode.OK


def gcs_nodes(head: RayHead, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    with grpc.insecure_channel(head.address) as ch:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(ch)
        try:
            stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=20, metadata=metadata)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK


def pod_env(**ray_auth: str) -> dict[str, str]:
    """This process's environment without any Ray auth setting, plus `ray_auth`; a HOME of its
    own so that no ~/.ray/auth_token is picked up behind the test's back."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME="/tmp/rljob-no-ray-token", RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S="1", **ray_auth)
    return env


def run_driver(head: RayHead, env: dict[str, str], mode: str = "once") -> str:
    out = subprocess.run([sys.executable, "-c", DRIVER, head.client_address, mode], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith(("RAN", "REFUSED"))]
    assert lines, f"driver printed no verdict: {out.stdout[-500:]} {out.stderr[-1500:]}"
    return lines[-1]


def test_ray_client_port_refuses_a_missing_or_wrong_token_and_admits_the_jobs(head: RayHead) -> None:
    assert client_ping(head, ()) == grpc.StatusCode.UNAUTHENTICATED
    assert client_ping(head, bearer("job-b-token")) == grpc.StatusCode.UNAUTHENTICATED
    assert client_ping(head, bearer(TOKEN)) == grpc.StatusCode.OK


def test_gcs_refuses_a_caller_without_the_token(head: RayHead) -> None:
    assert gcs_nodes(head, ()) == grpc.StatusCode.UNAUTHENTICATED
    assert gcs_nodes(head, bearer("job-b-token")) == grpc.StatusCode.UNAUTHENTICATED
    assert gcs_nodes(head, bearer(TOKEN)) == grpc.StatusCode.OK


def test_a_ray_client_without_the_token_runs_nothing_and_the_trainers_env_runs_a_task(head: RayHead) -> None:
    # The three drivers are independent processes: run at once (each spends seconds importing Ray).
    with ThreadPoolExecutor(3) as pool:
        missing = pool.submit(run_driver, head, pod_env())
        wrong = pool.submit(run_driver, head, pod_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="job-b-token"))
        right = pool.submit(run_driver, head, pod_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN), "retry")
        assert missing.result().startswith("REFUSED")
        assert wrong.result().startswith("REFUSED")
        assert right.result() == "RAN 42"
