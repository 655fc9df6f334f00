"""The executor's own Ray head: it goes away with the process that started it, even on SIGKILL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.ray

CHILD = (
    "from rollout_executor.rayhead import start_ray_head\n"
    "h = start_ray_head(num_cpus=1, object_store_bytes=100 * 2**20)\n"
    "print(h.gcs_port, flush=True)\n"
    "import time; time.sleep(600)\n"
)


def _up(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.2", port)) == 0


def test_killed_owner_takes_its_ray_head_down() -> None:
    owner = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        port = int(owner.stdout.readline())
        assert _up(port), "the head's GCS answers while its owner lives"
    finally:
        owner.kill()
        owner.wait(timeout=30)
    deadline = time.monotonic() + 60
    while _up(port):
        assert time.monotonic() < deadline, "the Ray head outlived its SIGKILLed owner"
        time.sleep(0.3)


JOIN = (
    "import ray\n"
    "from rollout_executor.rayhead import start_ray_head\n"
    "h = start_ray_head(num_cpus=1, object_store_bytes=100 * 2**20)\n"
    "try:\n"
    "    ray.init(address=h.address)\n"
    "    print('joined', ray.cluster_resources().get('CPU'), flush=True)\n"
    "    ray.shutdown()\n"
    "finally:\n"
    "    h.stop()\n"
)


def test_a_ray_token_in_the_users_home_does_not_lock_the_executor_out_of_its_own_head(tmp_path) -> None:
    """Ray 2.60's `ray start` turns token auth on by itself when ~/.ray/auth_token exists (a plain
    local `ray.init()` writes one), and a driver joining it does not: `rljob run` then died in
    the executor's ray.init with InvalidAuthToken on any machine whose user had run Ray before."""
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a" * 64)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", JOIN], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "joined 1.0" in done.stdout, done.stderr[-3000:]
