"""Restart one control-plane process of the test cluster in place: the kube-apiserver, for real.

Why not kwokctl (`kwokctl stop cluster` / `start cluster`): it stops and starts every
component, etcd included, and waits on all of them; on this machine that took 176 s and then
failed, far past a lean test, and a failed start leaves no cluster for the tests after it. In
kwok's binary runtime each component is one plain process (its pid in
`<workdir>/clusters/<name>/pids/<component>.pid`), and the kube-apiserver keeps no state of its
own (etcd does): stopping that one process and starting it again with the same argv,
environment and working directory is a kube-apiserver restart, with the same flags, so
the same audit log (it appends) and the same certificates and port. The pid file is rewritten,
so `tests/cluster/down` (kwokctl) stops the new process.

A restart that does not come back ready fails loudly (AssertionError with the component's log
tail) rather than leaving a broken cluster for the next test to trip on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.waiting import WaitTimeout, wait_for

APISERVER = "kube-apiserver"
# Clients of the API server that would exit once they cannot renew a leader Lease (10 s by
# default). The cluster runs them with --leader-elect=false (kwok.yaml); a restart still checks
# that they lived through it, so that a config that brought election back fails here.
LEADER_ELECTED = ("kube-controller-manager", "kube-scheduler")
START_ATTEMPTS = 3


@dataclass(frozen=True)
class Process:
    """One running component, as /proc shows it: what starts the same process again."""

    name: str
    pid: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str


def _workdir(cluster: Any) -> Path:
    return Path(cluster.cache) / "kwok" / "clusters" / cluster.name


def _pid_file(cluster: Any, name: str) -> Path:
    return _workdir(cluster) / "pids" / f"{name}.pid"


def _alive(pid: int) -> bool:
    """Running, or still exiting. A killed Go process shows as a zombie ("Z") as soon as its
    main thread is gone, while its other threads still exit with the files open: its listening
    port is only free once no thread is left (the process is not our child when kwokctl started
    it: init reaps it, maybe late, so a zombie with one task left is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        tasks = len(os.listdir(f"/proc/{pid}/task"))
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") or tasks > 1


def component(cluster: Any, name: str) -> Process:
    """The running process of component `name`; an AssertionError if there is none."""
    pid = int(_pid_file(cluster, name).read_text().strip())
    proc = Path(f"/proc/{pid}")
    argv = tuple(a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a)
    assert _alive(pid) and argv and Path(argv[0]).name == name, (
        f"pid {pid} of {name} is not {name}: {argv[:1]}"
    )
    env = dict(e.decode().split("=", 1) for e in (proc / "environ").read_bytes().split(b"\0") if b"=" in e)
    return Process(name=name, pid=pid, argv=argv, env=env, cwd=os.readlink(proc / "cwd"))


def stop(p: Process, timeout: float = 10.0) -> None:
    """SIGKILL, as a crash or a lost node does: every connection drops at once. A SIGTERM is a
    graceful drain instead: the kube-apiserver stopped listening but kept serving the open
    connections for 30 s and more here, long enough for the controller-manager to lose its
    Lease and exit, and a test could not tell when the server was gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGKILL)
    wait_for(lambda: not _alive(p.pid), timeout, interval=0.05, what=f"{p.name} (pid {p.pid}) killed")


def start(cluster: Any, p: Process) -> Process:
    """Start `p` again as kwokctl did: same argv, env, cwd, output appended to its log, a
    session of its own (it outlives this test process), its pid in kwok's pid file."""
    log = _workdir(cluster) / "logs" / f"{p.name}.log"
    with log.open("ab") as out:
        child = subprocess.Popen(
            cluster.in_netns(list(p.argv)),
            env=p.env,
            cwd=p.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _pid_file(cluster, p.name).write_text(str(child.pid))  # no newline: kwokctl Atoi()s it to stop it
    return Process(name=p.name, pid=child.pid, argv=p.argv, env=p.env, cwd=p.cwd)


def _log_tail(cluster: Any, name: str, n: int = 40) -> str:
    with contextlib.suppress(OSError):
        lines = (_workdir(cluster) / "logs" / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    return ""


def ready(cluster: Any) -> bool:
    res = cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
    return res.returncode == 0 and res.stdout.strip() == "ok"


def _came_up(cluster: Any, p: Process, deadline: float) -> bool:
    """/readyz answered ok before the deadline; False if `p` exited first (its port still held
    by the old process's last threads, say: another start may do) or the deadline passed."""
    try:
        state = wait_for(lambda: "ready" if ready(cluster) else ("" if _alive(p.pid) else "exited"),
                         max(1.0, deadline - time.monotonic()), interval=0.2, what=f"{p.name} /readyz")  # fmt: skip
    except WaitTimeout:
        return False
    return state == "ready"


@dataclass(frozen=True)
class Restart:
    down_s: float  # from the kill until /readyz answered ok again
    pid: int  # the new kube-apiserver's


def restart_apiserver(cluster: Any, ready_timeout: float = 90.0) -> Restart:
    """Kill the kube-apiserver, start it again with the same argv/env/cwd, wait for /readyz.

    The controller-manager and the scheduler must live through it (they exit when they cannot
    renew their Lease): checked, so a restart that broke the cluster fails here, not later."""
    old = component(cluster, APISERVER)
    elected = [component(cluster, n) for n in LEADER_ELECTED]
    t0 = time.monotonic()
    stop(old)
    deadline = t0 + ready_timeout
    for _ in range(START_ATTEMPTS):
        new = start(cluster, old)
        if _came_up(cluster, new, deadline):
            break
    else:
        raise AssertionError(
            f"the kube-apiserver did not come back ({START_ATTEMPTS} starts at most, {ready_timeout:.0f} s); "
            f"its log:\n{_log_tail(cluster, APISERVER)}"
        )
    down = time.monotonic() - t0
    assert component(cluster, APISERVER).argv == old.argv  # the same flags: audit log, port, certificates
    dead = [p for p in elected if not _alive(p.pid)]
    for p in dead:  # the cluster stays usable for the tests after this one, which then fails
        start(cluster, p)
    assert not dead, (
        f"{[p.name for p in dead]} exited during the kube-apiserver restart ({down:.1f} s down; started again)"
    )
    return Restart(down_s=down, pid=new.pid)
