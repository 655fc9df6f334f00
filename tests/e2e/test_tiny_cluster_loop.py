"""The whole RL loop as pods, as a user runs it: `kubectl apply -f examples/tiny-cluster.yaml` on
the test cluster with real pod networking (tests/cluster/README.md, RLJOB_TESTCLUSTER_PODNET=1).

The operator is `helm install`ed and runs in-cluster (its own ServiceAccount's projected token,
the API server through the `kubernetes` Service); one real vLLM CPU engine cell, the executor
Deployment and a trainer Job of two reference-trainer ranks are operator-made pods the agent runs
in their own network namespaces. The trainers reach `ray://tiny-cluster-rollout:10001` by the
Service's DNS name and the controller API by the chart's Service, with the trainer
ServiceAccount's token. Assertions: `kubectl get rlj` reaches Succeeded, `kubectl describe rlj`,
the trainer's logged rewards rise, and the RLJob is deleted after ttlSecondsAfterFinished.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import control_service_account, kjson

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cluster.yaml"
JOB = "tiny-cluster"
HOST_DIR = "/var/tmp/rljob-tiny-cluster"  # the example's host paths, replaced by the test's own
STEP_LOG = re.compile(r"step (\d+) reward ([0-9.]+) loss")


def manifest(tmp: Path) -> dict[str, Any]:
    """The example with its host paths under this test's directory."""
    text = EXAMPLE.read_text().replace(HOST_DIR, str(tmp))
    return yaml.safe_load(text)


def rewards(log: str) -> list[float]:
    return [float(m.group(2)) for m in STEP_LOG.finditer(log)]


@pytest.mark.timeout(1500)  # vLLM CPU start-up alone took 7 min on the shared 2 cores
def test_apply_tiny_cluster_trains_to_succeeded_and_is_deleted_after_ttl(podnet_cluster, loop_ns, tmp_path):
    c = podnet_cluster
    ns, release = loop_ns
    subprocess.run(
        [sys.executable, "-m", "rljob_client.tinymodel", str(tmp_path / "model")],
        check=True,
        capture_output=True,
        cwd=REPO,
        timeout=300,
    )
    (tmp_path / "weights").mkdir()
    job = manifest(tmp_path)
    control_service_account(c, ns, release, job["spec"]["trainer"]["serviceAccountName"])

    watch = subprocess.Popen(
        c.in_netns(
            [str(c.bin_dir / "kubectl"), "--kubeconfig", str(c.kubeconfig), "-n", ns, "get", "rlj", "-w"]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        c.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(job))

        def phase() -> str:
            return kjson(c, ns, "rlj", JOB).get("status", {}).get("phase", "")

        c.wait_for(lambda: phase() in ("Succeeded", "Failed"), timeout=900, interval=2, what="RLJob finished")
        row = c.kubectl("-n", ns, "get", "rlj", JOB).stdout
        text = c.kubectl("-n", ns, "describe", "rlj", JOB).stdout
        logs = {p.name: p.read_text(errors="replace") for p in (c.cache / "logs").glob(f"{ns}_*.log")}
        assert phase() == "Succeeded", f"{row}\n{text}\n" + "\n".join(
            f"== {k}\n{v[-3000:]}" for k, v in logs.items()
        )
        assert re.search(rf"^{JOB}\s+Succeeded\b", row.splitlines()[1]), row
        assert re.search(r"^  Phase:\s+Succeeded$", text, re.M), text

        # The trainer's rank 0 logged one reward per step, and it rose over the run.
        (rank0,) = [v for k, v in logs.items() if re.match(rf"{ns}_{JOB}-trainer-0-", k)]
        curve = rewards(rank0)
        print(f"\n[e2e] reward curve ({len(curve)} steps): {curve}")
        assert len(curve) == job["spec"]["trainer"]["reference"]["steps"], rank0[-3000:]
        assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3, curve
        # The trainers were given the executor by the Service's DNS name (no address), and
        # streamed every step's batch through it.
        trainer = kjson(c, ns, "job", f"{JOB}-trainer")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["RLJOB_ROLLOUT_ADDRESS"] == f"ray://{JOB}-rollout:10001"
        assert env["RLJOB_CONTROLLER_URL"] == f"http://{release}.{ns}.svc:8080"

        # Deleted after ttlSecondsAfterFinished.
        c.wait_for(
            lambda: c.kubectl("-n", ns, "get", "rlj", JOB, check=False).returncode != 0,
            timeout=job["spec"]["ttlSecondsAfterFinished"] + 120,
            what="RLJob deleted after its TTL",
        )
    finally:
        watch.terminate()
        out, _ = watch.communicate(timeout=10)
        print(f"[e2e] $ kubectl get rlj -w\n{out}")
