"""`ray start --head` exiting with Ray's fixed 30 s raylet timeout is retried; other failures are not.

A stand-in for `python -m ray.scripts.scripts start ...` (the `python` argument) plays Ray: it
fails as Ray does on a busy machine for the first N starts, then listens on the GCS and client
ports it was given, as a head that came up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rollout_executor.rayhead import RAY_START_TIMED_OUT, start_ray_head

FAKE_RAY = """#!{python}
import pathlib, socket, sys, time
argv = sys.argv
count = pathlib.Path({count!r})
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
if n < {fail_times}:
    print("Traceback (most recent call last):")
    print("Exception: {message}")
    sys.exit(1)
host = argv[argv.index("--node-ip-address") + 1]
socks = []
for flag, h in (("--port", host), ("--ray-client-server-port", "127.0.0.1")):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((h, int(argv[argv.index(flag) + 1])))
    s.listen()
    socks.append(s)
time.sleep(60)
"""


def fake_ray(tmp_path: Path, fail_times: int, message: str = RAY_START_TIMED_OUT + ". This could happen ...") -> Path:
    script = tmp_path / "python"
    count = tmp_path / "starts"
    script.write_text(FAKE_RAY.format(python=sys.executable, count=str(count), fail_times=fail_times, message=message))
    script.chmod(0o755)
    return script


def starts(tmp_path: Path) -> int:
    return int((tmp_path / "starts").read_text())


def test_a_raylet_registration_timeout_is_retried_on_a_fresh_head(tmp_path: Path) -> None:
    head = start_ray_head(python=str(fake_ray(tmp_path, fail_times=2)), startup_timeout_s=60, temp_dir=str(tmp_path))
    try:
        assert starts(tmp_path) == 3
        assert head.process.poll() is None
    finally:
        head.stop(grace_s=2)


def test_any_other_failure_of_ray_start_is_raised_at_once(tmp_path: Path) -> None:
    python = fake_ray(tmp_path, fail_times=5, message="ValueError: bad --num-cpus")
    with pytest.raises(RuntimeError, match="bad --num-cpus") as info:
        start_ray_head(python=str(python), startup_timeout_s=60, temp_dir=str(tmp_path))
    assert not isinstance(info.value, TimeoutError) and starts(tmp_path) == 1


def test_timeouts_past_the_deadline_end_in_a_timeout_naming_the_last_failure(tmp_path: Path) -> None:
    python = fake_ray(tmp_path, fail_times=1000)
    with pytest.raises(TimeoutError, match="Ray head"):
        start_ray_head(python=str(python), startup_timeout_s=3, temp_dir=str(tmp_path))
    assert starts(tmp_path) >= 2
