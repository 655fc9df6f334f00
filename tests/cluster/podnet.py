"""Pod network namespaces for the process agent (``RLJOB_TESTCLUSTER_PODNET=1``).

A kubelet asks its CNI plugins for a pod's network before it starts the pod's containers;
the agent does the same for a process pod: a named network namespace of its own, the CNI
``loopback`` plugin for its ``lo``, the CNI ``bridge`` plugin (with ``host-local`` IPAM) for an
``eth0`` veth to its node's bridge in the cluster's namespace, and an ``/etc/netns/<ns>/resolv.conf`` that ``ip netns
exec`` bind-mounts over ``/etc/resolv.conf`` in the process's own mount namespace (so the
process resolves Service names through the cluster's CoreDNS without knowing it).

kwok has already chosen the pod's address (``status.podIP``, from its node's podCIDR), and the
API server has already published it in EndpointSlices; the agent asks host-local for exactly
that address (``CNI_ARGS IP=``) so the address in the API is the one the process has.

Like a kubelet, the agent also projects the pod's ServiceAccount token (a TokenRequest bound
to the pod) with the cluster CA and the namespace into
``/var/run/secrets/kubernetes.io/serviceaccount`` (a bind mount in the process's mount
namespace) and sets ``KUBERNETES_SERVICE_HOST``/``_PORT``, so in-cluster clients work; the
token lives 2 h and is not refreshed (test jobs run minutes).

All of this happens inside the cluster's own network namespace (tests/cluster/up), where the
agent runs: the bridges and the host ends of the veths live there, and nothing is created in
the machine's namespace.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BRIDGE_PREFIX = "rljob-"


def bridge_name(node: str) -> str:
    """One bridge per node (the bridge plugin keeps one IPv4 gateway address per bridge); the
    cluster's namespace routes between them, as between nodes. Unique within that namespace."""
    return (BRIDGE_PREFIX + node)[:15]  # IFNAMSIZ


CNI_VERSION = "1.0.0"
ETC_NETNS = Path("/etc/netns")
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_SECONDS = 7200


def gateway_of(pod_cidr: str) -> str:
    """The bridge's address in a node's pod CIDR: its last usable address, because kwok hands
    out pod addresses from the bottom of the range and must never hand out the gateway's."""
    net = ipaddress.ip_network(pod_cidr)
    return str(net.broadcast_address - 1)


def bridge_config(node: str, pod_cidr: str, ipam_dir: Path) -> dict:
    """CNI network configuration of one node: its pod CIDR on its bridge."""
    return {
        "cniVersion": CNI_VERSION,
        "name": f"rljob-{node}",
        "type": "bridge",
        "bridge": bridge_name(node),
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": pod_cidr, "gateway": gateway_of(pod_cidr)}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": str(ipam_dir),
        },
    }


def loopback_config() -> dict:
    return {"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"}


def resolv_conf(namespace: str, dns_ip: str, domain: str) -> str:
    """What a kubelet writes for dnsPolicy ClusterFirst."""
    search = f"{namespace}.svc.{domain} svc.{domain} {domain}"
    return f"nameserver {dns_ip}\nsearch {search}\noptions ndots:5\n"


def hosts_file(pod_ip: str, hostname: str, subdomain: str, namespace: str, domain: str) -> str:
    """What a kubelet writes to a pod's /etc/hosts: its own name on its own address (libraries
    that pick their address from the hostname, like gloo, then pick the pod's)."""
    names = f"{hostname}.{subdomain}.{namespace}.svc.{domain}\t{hostname}" if subdomain else hostname
    return f"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{pod_ip}\t{names}\n"


def mac_of(pod_ip: str) -> str:
    """The MAC address of the pod's eth0: a function of its address (`0a:58:` and the address's
    four bytes, a locally administered unicast MAC, as kubenet gave its pods).

    kwok hands out the lowest free address of a node's range, so a pod that replaces a deleted
    one (an engine recreated by the operator) usually gets its address at once. With a random
    MAC, every pod that spoke to the old one still holds the old MAC in its neighbour table, and
    its first connection to the new pod stalls until that entry fails its probes: 11 s measured
    (SYN retransmissions), enough to time out a trainer's weight push into the new engine. The
    bridge plugin's gratuitous ARP on ADD did not correct the entry (measured: still the old MAC).
    With the MAC a function of the address, a stale entry is a correct one."""
    return "0a:58:" + ":".join(f"{octet:02x}" for octet in ipaddress.IPv4Address(pod_ip).packed)


def netns_name(prefix: str, uid: str) -> str:
    return f"{prefix}-p-{uid.replace('-', '')[:12]}"


def wrap(argv: list[str], netns: str, hostname: str, service_account: Path | None = None) -> list[str]:
    """argv run in the pod's network namespace, with /etc/netns/<netns>/ (resolv.conf, hosts)
    mounted over /etc/ and the projected ServiceAccount files over SERVICE_ACCOUNT_DIR, in the
    mount namespace that `ip netns exec` makes for it, and in a UTS namespace of its own with
    the pod's hostname. The shell execs argv, so the pid stays the process's."""
    script = (
        'hostname "$0" && { [ -z "$1" ] || mount --bind "$1" '
        + str(SERVICE_ACCOUNT_DIR)
        + '; } && shift && exec "$@"'
    )
    sa = str(service_account) if service_account is not None else ""
    return ["ip", "netns", "exec", netns, "unshare", "--uts", "sh", "-c", script, hostname, sa, *argv]


class CNIError(RuntimeError):
    pass


@dataclass(frozen=True)
class PodNetwork:
    cni_bin: Path  # bridge, host-local, loopback
    state: Path  # network configurations of pods (for DEL) and host-local's data
    prefix: str  # netns names: <prefix>-p-<uid>
    dns_ip: str
    domain: str = "cluster.local"

    def _cni(
        self, command: str, conf: dict, netns: str, container_id: str, ifname: str, cni_args: str = ""
    ) -> dict:
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": f"/run/netns/{netns}",
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(self.cni_bin),
        }
        if cni_args:
            env["CNI_ARGS"] = cni_args
        res = subprocess.run(
            [str(self.cni_bin / conf["type"])],
            input=json.dumps(conf),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if res.returncode != 0:
            raise CNIError(
                f"CNI {conf['type']} {command} for {container_id}: {res.stdout.strip()} {res.stderr.strip()}"
            )
        return json.loads(res.stdout) if res.stdout.strip() else {}

    def _conf_path(self, uid: str) -> Path:
        return self.state / "pods" / f"{uid}.json"

    def setup(
        self,
        uid: str,
        namespace: str,
        pod_ip: str,
        pod_cidr: str,
        node: str,
        hostname: str,
        subdomain: str = "",
    ) -> str:
        """The pod's network namespace, wired to its node's bridge with pod_ip; returns its name."""
        name = netns_name(self.prefix, uid)
        if not Path(f"/run/netns/{name}").exists():
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
        conf = bridge_config(node, pod_cidr, self.state / "ipam")
        path = self._conf_path(uid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"netns": name, "conf": conf}))
        self._cni("ADD", loopback_config(), name, uid, "lo")
        self._cni("ADD", conf, name, uid, "eth0", f"IgnoreUnknown=1;IP={pod_ip};MAC={mac_of(pod_ip)}")
        etc = ETC_NETNS / name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(resolv_conf(namespace, self.dns_ip, self.domain))
        (etc / "hosts").write_text(hosts_file(pod_ip, hostname, subdomain, namespace, self.domain))
        return name

    def project_service_account(self, uid: str, namespace: str, token: str, ca: bytes) -> Path:
        """The files a kubelet projects for the pod's ServiceAccount; returns their directory."""
        d = self.state / "serviceaccount" / uid
        d.mkdir(parents=True, exist_ok=True)
        (d / "token").write_text(token)
        (d / "ca.crt").write_bytes(ca)
        (d / "namespace").write_text(namespace)
        SERVICE_ACCOUNT_DIR.mkdir(parents=True, exist_ok=True)  # the mount point, empty outside pods
        return d

    def teardown(self, uid: str) -> None:
        """Release the address and delete the namespace (its veth goes with it)."""
        shutil.rmtree(self.state / "serviceaccount" / uid, ignore_errors=True)
        path = self._conf_path(uid)
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        name = saved["netns"]
        try:
            self._cni("DEL", saved["conf"], name, uid, "eth0")
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
            path.unlink(missing_ok=True)

    def teardown_all(self) -> None:
        for path in sorted((self.state / "pods").glob("*.json")):
            self.teardown(path.stem)
