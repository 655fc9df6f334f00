"""The executor's own Ray head: it goes away with the process that started it, even on SIGKILL."""

from __future__ import annotations

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
