"""Ending a process the tests started in a session of its own (peer operators: Kueue, KubeRay)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen[bytes], grace: float = 30) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` seconds; no-op once it has exited."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
