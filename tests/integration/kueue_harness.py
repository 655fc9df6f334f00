"""The real Kueue controller manager against the test cluster, for the Kueue tests only.

`KueueProcess` runs `kueue` (built from sigs.k8s.io/kueue by tests/cluster/build, under its
own cache key) as a local process with the test kubeconfig, after installing Kueue's CRDs
from the same module. Scoped so that it can never disturb the rest of the suite, which
shares the cluster:

- `manageJobsWithoutQueueName: false` and no Job or Pod webhook registered with the API
  server: only objects labelled `kueue.x-k8s.io/queue-name` (and children of an RLJob so
  labelled, since RLJob is an external framework) are Kueue's, and a Kueue that is down can
  never make a Job or Pod creation fail anywhere;
- the webhooks registered are those on Kueue's own resources (Workload, ClusterQueue,
  ResourceFlavor, Cohort, ...), taken from the module's config/components/webhook; the
  configurations are deleted when the process stops.

Webhook reachability: each webhook's `clientConfig` is a `url` on the control plane's
loopback (`https://127.0.0.1:<port>/<path>`), since the API server runs on this machine and
the test cluster has no Service networking (no kube-proxy: a ClusterIP leads nowhere). The
serving certificate is made here (a throwaway CA and a certificate for IP 127.0.0.1), not by
Kueue's internal cert management: that one issues a certificate for the Service's DNS name
`kueue-webhook-service.<ns>.svc`, which a URL on 127.0.0.1 does not match, and patches only
the webhook configurations it installed itself.

Kueue v0.17 without internal cert management also reads a metrics serving certificate from a
fixed path, /etc/kueue/metrics/certs (cmd/kueue/main.go; it exits without one, even with
metrics off): the same certificate is put there for the process's lifetime, and removed after
unless it was there before.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.cluster.fixtures import wait_for
from tests.cluster.procs import stop_group
from tests.integration.operator_harness import REPO, free_port

BUILD = REPO / "tests" / "cluster" / "build"
KUEUE_NAMESPACE = "kueue-system"
WEBHOOK_CONFIG = "rljob-test-kueue"
KUEUE_GROUP = "kueue.x-k8s.io"
EXTERNAL_FRAMEWORK = "RLJob.v1alpha1.rljob.io"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # fixed in Kueue v0.17's main.go


def kueue_dir() -> Path | None:
    """Kueue's build (bin/kueue, crds/, webhooks.yaml), or None when it is not built."""
    r = subprocess.run([str(BUILD), "--print-kueue"], capture_output=True, text=True, check=False)
    return Path(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None


def serving_certificate(out: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 in `out` (tls.crt, tls.key); the CA in PEM."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rljob-test-kueue-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca.public_bytes(serialization.Encoding.PEM)


def webhook_configurations(manifests: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhooks on its own resources only, pointed at https://127.0.0.1:<port>."""
    out = []
    bundle = base64.b64encode(ca_pem).decode()
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            if any(g != KUEUE_GROUP for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []):
                continue  # Job, Pod, JobSet, RayJob, ...: never intercepted in the shared cluster
            path = hook["clientConfig"]["service"]["path"]
            hooks.append(
                {**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}}
            )
        kind = doc["kind"]
        suffix = "mutating" if kind.startswith("Mutating") else "validating"
        out.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": kind,
                "metadata": {"name": f"{WEBHOOK_CONFIG}-{suffix}"},
                "webhooks": hooks,
            }
        )
    return out


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "leaderElection": {"leaderElect": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
    }


class KueueProcess:
    """Kueue's CRDs installed, its webhooks registered, its manager running; `stop()` undoes the webhooks."""

    def __init__(self, cluster: Any, build: Path, workdir: Path) -> None:
        self.cluster = cluster
        self.log_path = workdir / "kueue.log"
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(build / "crds"))
        for crd in sorted((build / "crds").glob("*.yaml")):
            name = yaml.safe_load(crd.read_text())["metadata"]["name"]
            cluster.wait_established(name)
        cluster.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
        self.webhook_port, self.health_port = free_port(), free_port()
        ca = serving_certificate(workdir / "certs")
        self._made: list[Path] = []  # what to remove after: only what was made here
        if not (METRICS_CERTS / "tls.crt").exists():
            top = next((p for p in reversed(METRICS_CERTS.parents) if not p.exists()), None)
            METRICS_CERTS.mkdir(parents=True, exist_ok=True)
            for f in ("tls.crt", "tls.key"):
                shutil.copy(workdir / "certs" / f, METRICS_CERTS / f)
            self._made = [top] if top is not None else [METRICS_CERTS / "tls.crt", METRICS_CERTS / "tls.key"]
        config = workdir / "kueue-config.yaml"
        config.write_text(
            yaml.safe_dump(configuration(self.webhook_port, self.health_port, workdir / "certs"))
        )
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        argv = [
            str(build / "bin" / "kueue"),
            f"--config={config}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ]
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._tls_ca = ca
        try:
            wait_for(lambda: self.proc.poll() is not None or self.ready(), 120, what="kueue /readyz")
            if self.proc.poll() is not None:
                raise AssertionError(f"kueue exited with {self.proc.returncode}:\n{self.log_tail()}")
            wait_for(self.webhook_answers, 60, what="kueue webhook server on 127.0.0.1")
            for obj in webhook_configurations(build / "webhooks.yaml", self.webhook_port, ca):
                cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def webhook_answers(self) -> bool:
        ctx = ssl.create_default_context(cadata=self._tls_ca.decode())
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{self.webhook_port}/healthz", timeout=2, context=ctx)
        except urllib.error.HTTPError:
            return True  # TLS worked and the server answered (404 is fine)
        except OSError:
            return False
        return True

    def log_tail(self, n: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self) -> None:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            suffix = "mutating" if kind.startswith("mutating") else "validating"
            self.cluster.kubectl(
                "delete", kind, f"{WEBHOOK_CONFIG}-{suffix}", "--ignore-not-found", check=False
            )
        stop_group(self.proc)
        for path in self._made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self._made = []


def queue_objects(name: str, namespace: str, gpus: int = 16) -> list[dict[str, Any]]:
    """The README's queue setup: a ClusterQueue of `gpus` GPUs on the GPU nodes (CPU pods on the
    CPU nodes), preemption by priority within it, and a LocalQueue `rl` in `namespace`."""
    return [
        {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {
             "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
             "preemption": {"withinClusterQueue": "LowerPriority"},
             "resourceGroups": [{
                 "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                 "flavors": [
                     {"name": "cpu-nodes", "resources": [
                         {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"},
                         {"name": "nvidia.com/gpu", "nominalQuota": "0"}]},
                     {"name": "gpu-nodes", "resources": [
                         {"name": "cpu", "nominalQuota": "128"}, {"name": "memory", "nominalQuota": "1Ti"},
                         {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]},
                 ],
             }],
         }},
        {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "LocalQueue", "metadata": {"name": "rl", "namespace": namespace},
         "spec": {"clusterQueue": name}},
    ]  # fmt: skip


FLAVORS = [
    {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "gpu-nodes"},
     "spec": {"nodeLabels": {"testcluster.rljob.io/pool": "gpu"},
              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
    {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "cpu-nodes"},
     "spec": {"nodeLabels": {"testcluster.rljob.io/pool": "cpu"}}},
]  # fmt: skip

PRIORITIES = [
    {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": name},
     "value": value, "description": f"rljob tests: {name}"}
    for name, value in (("rl-low", 100), ("rl-high", 1000))
]  # fmt: skip
