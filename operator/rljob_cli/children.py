"""Every process `rljob run` started, directly or further down, and the guarantee that none outlives it.

Engines, the executor and its Ray head each run in their own process group and are stopped
in order by their owners; this module is the backstop. Descendants are recorded (pid, start
time, command) in `pids.json` as they appear (at every spawn and step, so a grandchild is
on record before a crashed parent could orphan it); at the end, whatever recorded process
still exists is killed and the file says what was left (nothing, unless the kernel refused a
SIGKILL).

The runner does not make itself a child subreaper: orphans re-parented to it would stay
zombies until reaped, and Ray's client proxier fails when the server it just spawned shows up
as a zombie (`psutil.ZombieProcess` from `ray.util.client.server.proxier`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil


def reap_zombies() -> None:
    """Collect exit statuses of our finished children (at the very end: Popen objects are done by then)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def is_alive(pid: int, create_time: float) -> bool:
    """The same process (pid and start time) still exists and is not a zombie."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class ChildProcesses:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.me = psutil.Process()
        self.seen: dict[int, dict[str, Any]] = {}
        self.left: list[dict[str, Any]] | None = None

    def note(self, what: str, pid: int | None) -> None:
        """A process started on purpose (named for the record), then everything below us."""
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                p = psutil.Process(pid)
                self.seen[pid] = {"pid": pid, "create_time": p.create_time(), "what": what,
                                  "cmd": " ".join(p.cmdline()[:4])}
        self.snapshot()

    def snapshot(self) -> None:
        try:
            kids = self.me.children(recursive=True)
        except psutil.Error:
            return
        for p in kids:
            if p.pid in self.seen:
                continue
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self.seen[p.pid] = {"pid": p.pid, "create_time": p.create_time(), "what": "descendant",
                                    "cmd": " ".join(p.cmdline()[:4])}
        self.write()

    def alive(self) -> list[dict[str, Any]]:
        return [r for r in self.seen.values() if is_alive(r["pid"], r["create_time"])]

    def sweep(self, grace: float = 5.0) -> list[dict[str, Any]]:
        """SIGTERM, then SIGKILL, whatever recorded process is still there; returns the survivors."""
        self.snapshot()
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            alive = self.alive()
            if not alive:
                break
            for r in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(r["pid"], sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.alive():
                reap_zombies()
                time.sleep(0.1)
        reap_zombies()
        self.left = self.alive()
        self.write()
        return self.left

    def write(self) -> None:
        data = {"runner_pid": self.me.pid,
                "processes": sorted(self.seen.values(), key=lambda r: r["pid"]), "left_after_exit": self.left}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)
