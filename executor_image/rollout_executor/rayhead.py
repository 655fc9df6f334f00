"""Start and stop a Ray head that this process owns (the executor pod's, local mode's, tests').

`ray start --head --block` runs as a child in its own process group; stopping sends it
SIGTERM (it stops the Ray processes it started) and then SIGKILLs whatever is left of that
group. It also gets SIGTERM when its parent dies (PR_SET_PDEATHSIG), so a SIGKILLed executor
does not leave its head running. Never `ray stop`: it kills every Ray on the machine, other people's too.

Ports: every port Ray would otherwise take at a fixed number (dashboard 8265, dashboard agent
52365, worker ports 10002-19999) is chosen free here, so several heads can share a machine.
Ray rewrites a node address of 127.0.0.1 to the host's external address
(`services.resolve_ip_for_localhost`); to stay on loopback we use 127.0.0.2, which Linux
routes to `lo` as well. The client server listens on 127.0.0.1 too.

Auth: with `auth_token` the head runs with Ray's token authentication (`RAY_AUTH_MODE=token`,
the token in `RAY_AUTH_TOKEN`): GCS, the Ray Client server and the dashboard refuse callers
without it. In an executor pod the operator sets both variables from the job's Secret, so the
head inherits them without this argument.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rljob_client.errors import RLJobError
from rljob_client.retry_deadline import DeadlineExpired, retry_until

LOOPBACK_NODE_IP = "127.0.0.2"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


@dataclass
class RayHead:
    process: subprocess.Popen[bytes]
    node_ip: str
    gcs_port: int
    client_port: int
    temp_dir: str
    log_path: str

    @property
    def address(self) -> str:
        """For a driver on this node: `ray.init(address=...)`."""
        return f"{self.node_ip}:{self.gcs_port}"

    @property
    def client_address(self) -> str:
        """For Ray Client: `ray.init("ray://...")`."""
        return f"ray://127.0.0.1:{self.client_port}" if self.node_ip == LOOPBACK_NODE_IP else f"ray://{self.node_ip}:{self.client_port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self, grace_s: float = 20.0) -> None:
        pgid = self.process.pid  # start_new_session: the group is ours alone
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux), so a
    killed executor never leaves an orphaned Ray head behind (`ray start --block` stops its
    Ray processes on SIGTERM)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RayStartTimedOut(RLJobError, RuntimeError):
    """`ray start` gave up waiting for its raylet to register (Ray's fixed 30 s): a busy machine."""


# What `ray start` prints when its raylet did not register within Ray's own (fixed) 30 s.
RAY_START_TIMED_OUT = "The current node timed out during startup"


def start_ray_head(
    node_ip: str = "127.0.0.1",
    client_port: int | None = None,
    gcs_port: int | None = None,
    num_cpus: int = 2,
    object_store_bytes: int = 500 * 1024 * 1024,
    temp_dir: str | None = None,
    startup_timeout_s: float = 120.0,
    python: str = sys.executable,
    auth_token: str | None = None,
) -> RayHead:
    """A Ray head with a Ray Client server; returns once both GCS and client ports answer.

    `ray start` waits a fixed 30 s for its raylet to register and then exits; on two busy cores
    that happens (seen in CI under load), so that exit is retried on fresh processes until
    `startup_timeout_s`. Any other failure is raised at once."""
    deadline = time.monotonic() + startup_timeout_s

    def once() -> RayHead:
        return _start_ray_head_once(
            node_ip, client_port, gcs_port, num_cpus, object_store_bytes, temp_dir, deadline, python, auth_token
        )

    try:
        return retry_until(once, seconds=startup_timeout_s, retry_on=(RayStartTimedOut,), what="starting the Ray head")
    except DeadlineExpired as e:
        raise TimeoutError(str(e)) from e


def _start_ray_head_once(
    node_ip: str,
    client_port: int | None,
    gcs_port: int | None,
    num_cpus: int,
    object_store_bytes: int,
    temp_dir: str | None,
    deadline: float,
    python: str,
    auth_token: str | None,
) -> RayHead:
    if node_ip in ("127.0.0.1", "localhost"):
        node_ip = LOOPBACK_NODE_IP
    gcs_port = gcs_port or free_port()
    client_port = client_port or free_port()
    # Ray's socket paths must stay short (107 bytes): a short temp dir, not pytest's tmp_path.
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="rj", dir="/tmp")
    log_path = os.path.join(temp_dir, "ray-head.log")
    argv = [
        python, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        "--node-ip-address", node_ip,
        "--port", str(gcs_port),
        "--ray-client-server-port", str(client_port),
        "--num-cpus", str(num_cpus),
        "--object-store-memory", str(object_store_bytes),
        "--include-dashboard=false",
        "--dashboard-port", str(free_port()),
        "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()),
        "--min-worker-port", "0",
        "--max-worker-port", "0",
        "--temp-dir", temp_dir,
        "--disable-usage-stats",
    ]  # fmt: skip
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if auth_token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=auth_token)
    else:
        # Unset, Ray 2.60's `ray start` turns token auth on when ~/.ray/auth_token exists (a plain
        # local `ray.init()` writes one), while a driver joining the head does not: the
        # executor's own ray.init was then refused (InvalidAuthToken) and `rljob run` failed on
        # any machine where its user had once run Ray. An explicit mode in the environment (a
        # pod's RAY_AUTH_MODE=token) still wins.
        env.setdefault("RAY_AUTH_MODE", "disabled")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_die_with_parent
        )
    head = RayHead(proc, node_ip, gcs_port, client_port, temp_dir, log_path)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = head.log_tail()
            head.stop()
            error = RayStartTimedOut if RAY_START_TIMED_OUT in tail else RuntimeError
            raise error(f"ray start exited with {proc.returncode}:\n{tail}")
        if _port_open(node_ip, gcs_port) and _port_open("127.0.0.1" if node_ip == LOOPBACK_NODE_IP else node_ip, client_port):
            return head
        time.sleep(0.3)
    tail = head.log_tail()
    head.stop()
    raise TimeoutError(f"Ray head did not come up before its deadline:\n{tail}")
