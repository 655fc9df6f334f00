"""The executor leaves when the process that started it is gone, even if no signal reaches it.

`rljob run` starts the executor with PR_SET_PDEATHSIG, so a SIGKILLed runner SIGTERMs it; once in
CI that SIGTERM never stopped it (test_local_run's SIGKILL test found the executor and its Ray head
alive two minutes later). The executor's main loop also asks whether it was re-parented
(`rollout_executor.__main__.orphaned`). This runs that check for real: a grandchild that ignores
SIGTERM (the signal path out of play) polls it while its parent is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.cluster.waiting import wait_for

GRANDCHILD = """
import os, signal, sys, time
from rollout_executor.__main__ import orphaned
signal.signal(signal.SIGTERM, signal.SIG_IGN)
parent = os.getppid()
assert not orphaned(parent), "orphaned while the parent lives"
print("watching", flush=True)
while not orphaned(parent):
    time.sleep(0.1)
print("orphaned", flush=True)
"""

PARENT = """
import subprocess, sys, time
with open(sys.argv[1], "w") as out:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=out, stderr=subprocess.STDOUT)
print(child.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_process_whose_parent_is_sigkilled_sees_it_is_orphaned(tmp_path: Path) -> None:
    log = tmp_path / "grandchild.log"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(log), GRANDCHILD], stdout=subprocess.PIPE, text=True)
    grandchild = 0
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        wait_for(lambda: "watching" in log.read_text(), 60, interval=0.1, what="the grandchild to watch its parent")
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: gone(grandchild), 10, interval=0.1, what="the orphaned grandchild to exit")
        assert log.read_text().split() == ["watching", "orphaned"]
    finally:
        parent.kill()
        if grandchild and not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)
