"""Real pod networking on the test cluster (RLJOB_TESTCLUSTER_PODNET=1, tests/cluster/README.md).

The cluster lives in a network namespace of its own with no route off the machine; each
process pod runs in a namespace of its own on a veth to the cluster's bridge, wired by the
CNI plugins with the podIP the API shows; kube-proxy (nftables) serves ClusterIPs and CoreDNS
resolves Service names through the resolv.conf the agent gives each pod.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.fixtures import Cluster, env_value, inside_netns
from tests.cluster.podnet import BRIDGE_PREFIX, mac_of

pytestmark = pytest.mark.cluster

PID = "testcluster.rljob.io/pid"


def ip_json(cluster: Cluster, *args: str) -> list[dict]:
    """`ip -j -d ARGS` in the cluster's network namespace."""
    argv = cluster.in_netns(["ip", "-j", "-d", *args])
    return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout or "[]")


def kget(cluster: Cluster, ns: str, *what: str) -> dict:
    return json.loads(cluster.kubectl("-n", ns, "get", *what, "-o", "json").stdout)


def process_pod(name: str, argv: list[str], labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"testcluster.rljob.io/run": "process", **(labels or {})}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "ignored.invalid/none:0",
                    "command": argv,
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                }
            ],
        },
    }


# The client pod: resolves the Service by its short name (resolv.conf's search path), fetches
# it through the ClusterIP, and prints what it saw; the test reads the pod's log.
CLIENT = textwrap.dedent("""
    import json, os, socket, urllib.request
    ip = socket.gethostbyname("web")
    body = urllib.request.urlopen("http://web/", timeout=10).read().decode()
    s = socket.create_connection(("web", 80), timeout=10)
    local = s.getsockname()[0]
    s.close()
    print("RESULT " + json.dumps({"resolved": ip, "body": body, "local": local,
                                  "resolv": open("/etc/resolv.conf").read(),
                                  "netns": os.readlink("/proc/self/ns/net"),
                                  "hostname": socket.gethostname(),
                                  "self": socket.gethostbyname(socket.gethostname())}), flush=True)
""")
SERVER = textwrap.dedent("""
    import http.server, os
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ("hello from " + os.environ["POD_IP"]).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
""")


@pytest.fixture(scope="module")
def web(podnet_cluster: Cluster) -> Iterator[tuple[str, dict]]:
    """A namespace with a process pod `web` serving HTTP on its podIP:8080 behind Service web:80."""
    c = podnet_cluster
    ns = c.create_namespace(f"t-podnet-{uuid.uuid4().hex[:6]}")
    manifest = [
        process_pod("web", [sys.executable, "-c", SERVER], {"app": "web"}),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    ]
    c.kubectl(
        "-n",
        ns,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifest}),
    )
    pod = c.wait_for(
        lambda: (p := kget(c, ns, "pod", "web"))["metadata"].get("annotations", {}).get(PID) and p,
        timeout=60,
        what="web started by the agent",
    )
    # kube-proxy programs a new Service asynchronously: until then a pod's packet to the
    # ClusterIP finds no route in the cluster's namespace ("network unreachable").
    cluster_ip = kget(c, ns, "service", "web")["spec"]["clusterIP"]
    c.wait_for(
        lambda: service_programmed(c, cluster_ip, pod["status"]["podIP"]),
        timeout=60,
        what="kube-proxy's nftables rules for Service web",
    )
    try:
        yield ns, pod
    finally:
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def service_programmed(c: Cluster, cluster_ip: str, endpoint_ip: str) -> bool:
    """Whether kube-proxy's nftables table names the ClusterIP and the endpoint behind it."""
    argv = c.in_netns(["nft", "list", "table", "ip", "kube-proxy"])
    rules = subprocess.run(argv, capture_output=True, text=True).stdout
    return cluster_ip in rules and endpoint_ip in rules


def test_endpointslice_carries_the_pods_own_address(podnet_cluster, web):
    ns, pod = web
    pod_ip = pod["status"]["podIP"]
    node = kget(podnet_cluster, "default", "node", pod["spec"]["nodeName"])
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(node["spec"]["podCIDR"])
    assert not ipaddress.ip_address(pod_ip).is_loopback

    def slice_addresses():
        out = kget(podnet_cluster, ns, "endpointslices", "-l", "kubernetes.io/service-name=web")
        return [a for s in out["items"] for e in s.get("endpoints") or [] for a in e["addresses"]]

    assert podnet_cluster.wait_for(slice_addresses, timeout=60, what="web's EndpointSlice") == [pod_ip]
    table = podnet_cluster.kubectl("-n", ns, "get", "endpointslices").stdout
    assert pod_ip in table, table
    # The process has that address on its own eth0, in a network namespace that is not the agent's.
    pid = int(pod["metadata"]["annotations"][PID])
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink(f"/proc/{podnet_cluster.agent_pid()}/ns/net")
    addrs = json.loads(
        subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "ip", "-j", "addr", "show", "eth0"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert [a["local"] for a in addrs[0]["addr_info"] if a["family"] == "inet"] == [pod_ip]
    # Its MAC is a function of that address: a pod that later gets the address (kwok reuses the
    # lowest free one at once) is reached through its peers' neighbour entries as they stand.
    assert addrs[0]["address"] == mac_of(pod_ip)


def run_to_result(c, ns: str, name: str, code: str) -> tuple[dict, dict]:
    """Run `code` as a process pod to completion: the pod, and the JSON it printed after `RESULT `."""
    c.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(process_pod(name, [sys.executable, "-c", code])))
    pod = c.wait_for(
        lambda: (p := kget(c, ns, "pod", name))["status"].get("phase") in ("Succeeded", "Failed") and p,
        timeout=90,
        what=f"{name} pod finished",
    )
    log = (c.cache / "logs" / f"{ns}_{name}.log").read_text()
    assert pod["status"]["phase"] == "Succeeded", log
    return pod, json.loads(next(line for line in log.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])


def test_pod_reaches_a_service_by_dns_name_through_kube_proxy(podnet_cluster, web):
    ns, server = web
    c = podnet_cluster
    svc = kget(c, ns, "service", "web")
    pod, result = run_to_result(c, ns, "client", CLIENT)
    assert result["resolved"] == svc["spec"]["clusterIP"]  # CoreDNS answered with the ClusterIP
    assert result["body"] == f"hello from {server['status']['podIP']}"  # kube-proxy sent it to web
    assert result["local"] == pod["status"]["podIP"]  # the client speaks from its own pod address
    assert result["hostname"] == "client" and result["self"] == pod["status"]["podIP"]  # /etc/hosts, UTS
    dns = env_value(c.cache, "RLJOB_TESTCLUSTER_DNS")
    assert f"nameserver {dns}" in result["resolv"]
    assert f"search {ns}.svc.cluster.local" in result["resolv"]
    # The client's network namespace is gone with its process.
    assert not list(Path("/run/netns").glob(f"{c.netns}-p-{pod['metadata']['uid'].replace('-', '')[:12]}"))


def test_cluster_namespace_has_no_route_off_the_machine(podnet_cluster, web):
    c = podnet_cluster
    routes = ip_json(c, "route", "show", "table", "all")
    assert routes, "no routes listed"
    assert not [r for r in routes if r.get("dst") == "default"], routes
    links = ip_json(c, "link", "show")
    bridges = {link["ifname"] for link in links if link.get("linkinfo", {}).get("info_kind") == "bridge"}
    assert bridges and all(b.startswith(BRIDGE_PREFIX) for b in bridges), bridges
    for link in links:
        if link["ifname"] == "lo" or link["ifname"] in bridges:
            continue
        # Only the host ends of the pods' veths, each a port of a node's bridge.
        assert link.get("linkinfo", {}).get("info_kind") == "veth" and link.get("master") in bridges, link
    # Every address is loopback, the DNS address, or a gateway in a node's pod CIDR.
    cidrs = [ipaddress.ip_network(n["spec"]["podCIDR"]) for n in kget(c, "default", "nodes")["items"]]
    dns = ipaddress.ip_address(env_value(c.cache, "RLJOB_TESTCLUSTER_DNS") or "")
    for link in ip_json(c, "addr", "show"):
        for a in link.get("addr_info", []):
            if a["family"] != "inet":
                continue
            ip = ipaddress.ip_address(a["local"])
            assert ip.is_loopback or ip == dns or any(ip in n for n in cidrs), (link["ifname"], a)
    # ... and the machine's own namespace (this test's, when it runs outside the cluster's, as
    # in CI) has neither the pods' addresses nor a route to them.
    if inside_netns(c.netns or ""):
        return

    def host(*args: str) -> list[dict]:
        out = subprocess.run(["ip", "-j", *args], check=True, capture_output=True, text=True).stdout
        return json.loads(out or "[]")

    host_ips = {
        ipaddress.ip_address(a["local"]) for link in host("addr", "show") for a in link.get("addr_info", [])
    }
    assert not [ip for ip in host_ips for n in cidrs if ip in n]
    for r in host("route", "show", "table", "all"):
        if r.get("dst", "default") == "default":
            continue
        net = ipaddress.ip_network(r["dst"], strict=False)
        assert not any(net.version == n.version and net.overlaps(n) for n in cidrs), r
    assert not [link for link in host("link", "show") if link["ifname"].startswith(BRIDGE_PREFIX)]


# In-cluster config, as a pod's client library does it: KUBERNETES_SERVICE_HOST/PORT and the
# projected token and CA under /var/run/secrets/kubernetes.io/serviceaccount.
WHOAMI = textwrap.dedent("""
    import json, os, socket
    from kubernetes import client, config
    config.load_incluster_config()
    review = client.AuthenticationV1Api().create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    info = review.status.user_info
    print("RESULT " + json.dumps({"user": info.username, "extra": info.extra,
                                  "host": os.environ["KUBERNETES_SERVICE_HOST"],
                                  "dns": socket.gethostbyname("kubernetes.default")}), flush=True)
""")


def test_pod_reaches_the_api_server_as_its_service_account(podnet_cluster, web):
    ns, _server = web
    c = podnet_cluster
    kubernetes_ip = kget(c, "default", "service", "kubernetes")["spec"]["clusterIP"]
    _pod, result = run_to_result(c, ns, "whoami", WHOAMI)
    assert result["user"] == f"system:serviceaccount:{ns}:default"
    assert result["extra"]["authentication.kubernetes.io/pod-name"] == ["whoami"]  # bound to this pod
    assert result["host"] == result["dns"] == kubernetes_ip
