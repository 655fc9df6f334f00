"""Every address in the test cluster is a loopback address, and the control plane listens on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

pytestmark = pytest.mark.cluster

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def is_loopback(addr: str) -> bool:
    return ipaddress.ip_address(addr) in LOOPBACK


def test_nodes_pods_and_services_have_loopback_addresses(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    # Make sure there is at least one pod and one service of our own to look at.
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "p"}},
        "spec": {"containers": [{"name": "c", "image": "x.invalid/y:0"}]},
    })
    core.create_namespaced_service(namespace, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"selector": {"app": "p"}, "ports": [{"port": 80}]},
    })
    cluster.wait_pod_phase(namespace, "p", "Running", timeout=60)

    nodes = core.list_node().items
    assert len(nodes) >= 6
    for node in nodes:
        ips = [a.address for a in node.status.addresses if a.type in ("InternalIP", "ExternalIP")]
        assert ips, node.metadata.name
        assert all(is_loopback(ip) for ip in ips), (node.metadata.name, ips)
        for cidr in node.spec.pod_cidrs or [node.spec.pod_cidr]:
            assert ipaddress.ip_network(cidr).subnet_of(LOOPBACK), (node.metadata.name, cidr)

    pods = [p for p in core.list_pod_for_all_namespaces().items if p.status.pod_ip]
    assert any(p.metadata.namespace == namespace for p in pods)
    for pod in pods:
        ips = [pod.status.pod_ip, pod.status.host_ip] + [i.ip for i in pod.status.pod_ips or []]
        assert all(is_loopback(ip) for ip in ips if ip), (pod.metadata.namespace, pod.metadata.name, ips)

    services = core.list_service_for_all_namespaces().items
    assert any(s.metadata.name == "kubernetes" for s in services)
    for svc in services:
        for ip in svc.spec.cluster_ips or [svc.spec.cluster_ip]:
            assert ip == "None" or is_loopback(ip), (svc.metadata.namespace, svc.metadata.name, ip)

    slices = client.DiscoveryV1Api(cluster.api()).list_endpoint_slice_for_all_namespaces().items
    for sl in slices:
        for ep in sl.endpoints or []:
            assert all(is_loopback(a) for a in ep.addresses), (sl.metadata.name, ep.addresses)


def _listening_inodes() -> dict[int, str]:
    """socket inode -> 'ip:port' for TCP sockets in LISTEN state (IPv4 and IPv6)."""
    out: dict[int, str] = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # LISTEN
                continue
            hexip, hexport = f[1].split(":")
            raw = bytes.fromhex(hexip)
            if v6:
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
            else:
                raw = raw[::-1]
            out[int(f[9])] = f"{ipaddress.ip_address(raw)}:{int(hexport, 16)}"
    return out


def _control_plane_pids(component_dir: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv0 = Path((d / "cmdline").read_bytes().split(b"\0")[0].decode())
        except OSError:
            continue
        if argv0.parent == component_dir and argv0.name in CONTROL_PLANE:
            found.setdefault(argv0.name, []).append(int(d.name))
    return found


def test_control_plane_listens_only_on_loopback(cluster):
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    assert urlparse(server).hostname == "127.0.0.1", server

    listening = _listening_inodes()
    pids = _control_plane_pids(cluster.component_dir)
    assert sorted(pids) == sorted(CONTROL_PLANE), pids
    for name, plist in pids.items():
        addrs = []
        for pid in plist:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in listening:
                        addrs.append(listening[inode])
        assert addrs, f"{name} listens nowhere?"
        for a in addrs:
            ip = a.rsplit(":", 1)[0]
            assert is_loopback(ip), f"{name} listens on {a}"
        if name == "kube-apiserver":
            assert f"127.0.0.1:{urlparse(server).port}" in addrs, addrs
