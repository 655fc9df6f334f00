#!/usr/bin/env python3
"""Measure a running test cluster: pod create -> Running latency, and control-plane memory.

    .venv/bin/python tests/cluster/measure.py [--pods 20]

Uses ${RLJOB_TESTCLUSTER_CACHE:-~/.cache/rljob-testcluster}/kubeconfig. Creates and deletes
a namespace of its own. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from kubernetes import client, config, watch

CACHE = Path(os.environ.get("RLJOB_TESTCLUSTER_CACHE", str(Path.home() / ".cache/rljob-testcluster")))
NAME = os.environ.get("RLJOB_TESTCLUSTER_NAME", "rljob-test")


def pod(name: str, gpus: int) -> dict:
    c: dict = {"name": "main", "image": "x.invalid/y:0"}
    spec: dict = {"containers": [c], "restartPolicy": "Never"}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def time_to_running(core: client.CoreV1Api, ns: str, body: dict, timeout: float = 60) -> float:
    name = body["metadata"]["name"]
    t0 = time.monotonic()
    created = core.create_namespaced_pod(ns, body)
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}",
                       resource_version=created.metadata.resource_version, timeout_seconds=int(timeout)):
        if ev["object"].status.phase == "Running":
            w.stop()
            return time.monotonic() - t0
    raise TimeoutError(name)


def rss() -> dict:
    out = {}
    bindir = str(CACHE / "kwok" / "clusters" / NAME / "bin")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            status = (d / "status").read_text()
        except OSError:
            continue
        is_agent = any(a.endswith(b"tests/cluster/agent.py") for a in cmd) and str(CACHE).encode() in b" ".join(cmd)
        exe = cmd[0].decode()
        if not (exe.startswith(bindir + "/") or is_agent):
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        name = "agent" if is_agent else Path(exe).name
        out[name] = {"rss_mib": int(fields["VmRSS"].split()[0]) // 1024,
                     "peak_rss_mib": int(fields["VmHWM"].split()[0]) // 1024}
    out["total_peak_rss_mib"] = sum(v["peak_rss_mib"] for v in out.values())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=20)
    args = ap.parse_args()
    api = config.new_client_from_config(config_file=str(CACHE / "kubeconfig"))
    core = client.CoreV1Api(api)
    ns = f"measure-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                core.read_namespaced_service_account("default", ns)
                break
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        lat = [time_to_running(core, ns, pod(f"p{i}", gpus=i % 2)) for i in range(args.pods)]
        # A process pod: create -> its HTTP server answers on the pod IP.
        t0 = time.monotonic()
        core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "labels": {"testcluster.rljob.io/run": "process"}},
            "spec": {"containers": [{
                "name": "main", "image": "x", "command": [sys.executable, "-m", "http.server"],
                "args": ["--bind", "$(POD_IP)", "8080"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            }]},
        })
        http_s = None
        while time.monotonic() - t0 < 60:
            ip = core.read_namespaced_pod("web", ns).status.pod_ip
            if ip:
                try:
                    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=1):
                        http_s = time.monotonic() - t0
                        break
                except OSError:
                    pass
            time.sleep(0.05)
        print(json.dumps({
            "pods": len(lat),
            "create_to_running_s": {"median": round(statistics.median(lat), 3), "max": round(max(lat), 3),
                                    "min": round(min(lat), 3)},
            "process_pod_create_to_http_s": None if http_s is None else round(http_s, 3),
            "memory": rss(),
        }, indent=1))
    finally:
        core.delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
