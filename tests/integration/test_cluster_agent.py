"""The process agent: pods labelled testcluster.rljob.io/run=process run as real local processes."""

from __future__ import annotations

import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

pytestmark = pytest.mark.cluster

PID = "testcluster.rljob.io/pid"


def process_pod(name: str, command: list[str], args: list[str] | None = None, env: list | None = None,
                restart_policy: str = "Never") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"testcluster.rljob.io/run": "process"}},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [{
                "name": "main",
                "image": "ignored.invalid/none:0",
                "command": command,
                "args": args or [],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    *(env or []),
                ],
            }],
        },
    }


def http_get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_process_pod_serves_http_on_its_pod_ip_and_fails_when_killed(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    core.create_namespaced_pod(namespace, process_pod(
        "web", [sys.executable, "-m", "http.server"], ["--bind", "$(POD_IP)", "8080"]))
    pod = cluster.wait_pod(namespace, "web", lambda p: PID in (p.metadata.annotations or {}),
                           timeout=60, what="the agent to start the process")
    assert pod.status.phase == "Running"
    ip = pod.status.pod_ip
    assert ip.startswith("127."), ip
    status = cluster.wait_for(lambda: http_get(f"http://{ip}:8080/"), timeout=30,
                              what=f"the HTTP server on {ip}:8080")
    assert status == 200
    log = cluster.cache / "logs" / f"{namespace}_web.log"
    cluster.wait_for(lambda: "GET / HTTP" in log.read_text(), timeout=10, what="the request in the pod log")

    pid = int(pod.metadata.annotations[PID])
    assert pid_alive(pid)
    os.kill(pid, signal.SIGKILL)
    pod = cluster.wait_pod_phase(namespace, "web", "Failed", timeout=30)
    term = pod.status.container_statuses[0].state.terminated
    assert term is not None and term.reason == "ProcessExited"
    assert term.exit_code == 128 + signal.SIGKILL
    assert pod.status.container_statuses[0].state.running is None
    with pytest.raises(OSError):
        http_get(f"http://{ip}:8080/")
    # kwok must not bring it back: still Failed after a fresh read.
    assert core.read_namespaced_pod("web", namespace).status.phase == "Failed"


def test_process_exit_zero_succeeds_with_env_and_var_expansion(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    script = "import os, sys; print('argv', sys.argv[1:]); print('cwd', os.getcwd()); print('ns', os.environ['POD_NAMESPACE'])"
    core.create_namespaced_pod(namespace, process_pod(
        "once", [sys.executable, "-c", script], ["$(GREETING)-$(POD_NAME)", "$$(GREETING)", "$(UNDEFINED)"],
        env=[{"name": "GREETING", "value": "hello"}]))
    pod = cluster.wait_pod_phase(namespace, "once", "Succeeded", timeout=60)
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 0 and term.reason == "Completed"
    out = (cluster.cache / "logs" / f"{namespace}_once.log").read_text()
    assert "argv ['hello-once', '$(GREETING)', '$(UNDEFINED)']" in out
    assert f"cwd {Path(__file__).resolve().parents[2]}" in out
    assert f"ns {namespace}" in out


def test_process_exit_code_is_reported(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    core.create_namespaced_pod(namespace, process_pod(
        "bad", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]))
    pod = cluster.wait_pod_phase(namespace, "bad", "Failed", timeout=60)
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 3 and term.reason == "ProcessExited"
    assert "boom" in term.message


def test_deleting_a_process_pod_stops_its_process_group(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    # The shell forks a child: both are in the pod's process group and must go.
    core.create_namespaced_pod(namespace, process_pod(
        "sleeper", ["/bin/sh", "-c", "sleep 300 & echo child $! ; wait"]))
    pod = cluster.wait_pod(namespace, "sleeper", lambda p: PID in (p.metadata.annotations or {}),
                           timeout=60, what="the agent to start the process")
    pid = int(pod.metadata.annotations[PID])
    log = cluster.cache / "logs" / f"{namespace}_sleeper.log"
    child = int(cluster.wait_for(lambda: [ln for ln in log.read_text().splitlines() if ln.startswith("child ")],
                                 timeout=10, what="the child pid in the log")[0].split()[1])
    assert pid_alive(pid) and pid_alive(child)
    core.delete_namespaced_pod("sleeper", namespace)  # default grace period: 30 s

    def gone():
        try:
            core.read_namespaced_pod("sleeper", namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    # The agent stops the group and deletes the pod well before the 30 s grace period ends.
    cluster.wait_for(gone, timeout=20, what="the pod to be deleted by the agent")
    assert not pid_alive(pid)
    cluster.wait_for(lambda: not pid_alive(child), timeout=5, what="the child process to die")


def test_fail_annotation_makes_a_running_pod_fail(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x.invalid/y:0"}]},
    })
    cluster.wait_pod_phase(namespace, "victim", "Running", timeout=60)
    core.patch_namespaced_pod("victim", namespace, {"metadata": {"annotations": {
        "testcluster.rljob.io/fail": "true", "testcluster.rljob.io/fail-exit-code": "7"}}})
    pod = cluster.wait_pod_phase(namespace, "victim", "Failed", timeout=30)
    assert pod.status.container_statuses[0].state.terminated.exit_code == 7


def test_agent_restart_adopts_live_processes_and_fails_lost_ones(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    for name in ("kept", "lost"):
        core.create_namespaced_pod(namespace, process_pod(name, ["sleep", "600"]))
    pids = {}
    for name in ("kept", "lost"):
        pod = cluster.wait_pod(namespace, name, lambda p: PID in (p.metadata.annotations or {}),
                               timeout=60, what=f"the agent to start {name}")
        pids[name] = int(pod.metadata.annotations[PID])

    agent = cluster.agent_pid()
    os.kill(agent, signal.SIGKILL)  # a crash: its processes must live on
    cluster.wait_for(lambda: not pid_alive(agent), timeout=10, what="the agent to die")
    os.kill(pids["lost"], signal.SIGKILL)  # dies while no agent watches
    assert pid_alive(pids["kept"])

    cluster.up()  # starts a new agent
    assert cluster.agent_pid() != agent
    pod = cluster.wait_pod_phase(namespace, "lost", "Failed", timeout=30)
    term = pod.status.container_statuses[0].state.terminated
    assert term.reason == "ProcessExited" and term.exit_code == 255
    assert "not running" in term.message
    # The live one was adopted, not restarted: same pid, still Running ...
    pod = core.read_namespaced_pod("kept", namespace)
    assert pod.status.phase == "Running" and pod.metadata.annotations[PID] == str(pids["kept"])
    # ... and watched: when it dies the new agent reports it.
    os.kill(pids["kept"], signal.SIGTERM)
    pod = cluster.wait_pod_phase(namespace, "kept", "Failed", timeout=30)
    assert pod.status.container_statuses[0].state.terminated.reason == "ProcessExited"
