"""How `tests/cluster/up` starts its daemons and finds them again (tests/cluster/daemons.sh).

The bug this guards: `start_daemon` returned right after the fork, while `$!` still named a
shell whose command line was `up`'s own, so the liveness check that followed took a live
CoreDNS for dead and `up` failed ("coredns died") on a fresh machine. The launcher below
widens that window on purpose: it becomes the daemon (its name in its command line) only
after a pause, as a process does when its exec is slow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

DAEMONS = Path(__file__).resolve().parents[1] / "cluster" / "daemons.sh"
NAME = "rljob-fake-daemon"


def _bash(cache: Path, script: str) -> subprocess.CompletedProcess[str]:
    prelude = f'set -euo pipefail; CACHE="{cache}"; IN=(); log() {{ :; }}; source "{DAEMONS}"\n'
    return subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True, timeout=60)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "logs").mkdir()
    yield tmp_path
    pid_file = tmp_path / f"{NAME}.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        with contextlib.suppress(OSError):
            if NAME in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)


def _launcher(cache: Path, body: str) -> Path:
    path = cache / "launcher"
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_daemon_whose_exec_is_slow_is_alive_as_soon_as_start_daemon_returns(cache: Path) -> None:
    launcher = _launcher(cache, f"sleep 0.5; exec -a {NAME} sleep 60")
    res = _bash(cache, f'start_daemon {NAME} "{launcher}"; daemon_alive {NAME} && echo alive || echo dead')
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "alive"
    assert NAME in Path(f"/proc/{int((cache / f'{NAME}.pid').read_text())}/cmdline").read_text()


def test_a_daemon_that_exits_at_once_is_reported_dead(cache: Path) -> None:
    launcher = _launcher(cache, "exit 3")
    res = _bash(cache, f'start_daemon {NAME} "{launcher}"; daemon_alive {NAME} && echo alive || echo dead')
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "dead"


def test_a_pid_file_naming_some_other_live_process_is_not_the_daemon(cache: Path) -> None:
    (cache / f"{NAME}.pid").write_text(str(os.getpid()))  # this test's own process: alive, not it
    res = _bash(cache, f"daemon_alive {NAME} && echo alive || echo dead")
    assert res.stdout.strip() == "dead"
    (cache / f"{NAME}.pid").unlink()


def test_a_daemon_seen_between_two_execs_of_its_start_chain_is_not_taken_for_dead(cache: Path) -> None:
    # The chain nohup -> `ip netns exec` -> daemon: start_daemon returns once the first exec
    # holds the name; the next one is seen without it for a while (here 1 s, as when a loaded
    # machine pages in a large binary), and daemon_alive must not call that dead. The check is
    # made once the process is seen in that middle stage.
    stage2 = cache / "stage2"
    stage2.write_text(f"sleep 1; exec -a {NAME} sleep 60\n")
    launcher = _launcher(cache, f"exec -a {NAME}-launcher bash -c 'sleep 0.3; exec bash \"{stage2}\"'")
    res = _bash(
        cache,
        f'start_daemon {NAME} "{launcher}"; pid=$(cat "$CACHE/{NAME}.pid")\n'
        f"while grep -q {NAME} /proc/$pid/cmdline; do sleep 0.02; done\n"
        f"grep -q stage2 /proc/$pid/cmdline && echo middle\n"
        f"daemon_alive {NAME} && echo alive || echo dead",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["middle", "alive"]
