"""The whole RL loop as pods, as a user runs it: `kubectl apply -f examples/tiny-cluster.yaml` on
the test cluster with real pod networking (tests/cluster/README.md, RLJOB_TESTCLUSTER_PODNET=1).

The operator is `helm install`ed and runs in-cluster (its own ServiceAccount's projected token,
the API server through the `kubernetes` Service); one real vLLM CPU engine cell, the executor
Deployment and a trainer Job of two reference-trainer ranks are operator-made pods the agent runs
in their own network namespaces. The trainers reach `ray://tiny-cluster-rollout:10001` by the
Service's DNS name and the controller API by the chart's Service, with the trainer
ServiceAccount's token. Assertions: `kubectl get rlj` reaches Succeeded, `kubectl describe rlj`,
the trainer's logged rewards rise, and the RLJob is deleted after ttlSecondsAfterFinished.

Faults, injected into that one run in sequence (one vLLM start and one job for all three: the
CI budget), each once rank 0 has logged a chosen step:

* the executor pod is deleted (after step EXECUTOR_FAULT_STEP): the Deployment recreates it, the
  new executor resumes the dataset position it saved after the last rollout both ranks took,
  the trainers reconnect (`RolloutStream`, a deadline rather than 4 attempts) and learn the new
  pod's side-channel address from it; no prompt is trained twice and none is skipped, checked
  against the batch log both ranks write (`--batches-file`) and the order a fault-free run
  takes from the dataset;
* trainer rank 1 is killed (SIGKILL, after TRAINER_FAULT_STEP): rank 0 fails fast, the operator
  recreates the trainer Job (trainerRestarts 1) and both ranks resume from the newest checkpoint
  (the test turns on saveEverySteps), retraining only the steps after it, on the same prompts;
* the engine process is killed (after ENGINE_FAULT_STEP of the restarted trainer): the operator
  recreates the cell, which rejoins serving after the next weight update (its Events: CellReplaced,
  then CellServing at a later version). Last, because steps take seconds once an engine serves:
  a fault after it could not be placed before the run ends.

The executor's metrics (its side channel's /metrics, scraped at the new pod's address) count the
samples it generated and the shards it served over that channel after its replacement.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_operator import labels as L
from rollout_executor.dataset import PromptDataset

from tests.cluster.fixtures import Cluster
from tests.cluster.waiting import WaitTimeout
from tests.e2e.conftest import PID_ANNOTATION, control_service_account, kjson

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cluster.yaml"
JOB = "tiny-cluster"
HOST_DIR = "/var/tmp/rljob-tiny-cluster"  # the example's host paths, replaced by the test's own
STEP_LOG = re.compile(r"step (\d+) reward ([0-9.]+) loss")
RESUMED_LOG = re.compile(r"resumed from checkpoint \S+: step (\d+)")
RECONNECTED_LOG = re.compile(r"reconnected to the executor at \S+ after [0-9.]+ s \(data channel http://([0-9.]+):(\d+)\)")
READY_LOG = re.compile(r'^\{"event": "ready".*$', re.M)
SAVE_EVERY = 2  # checkpoints after steps 1, 3, 5, ...: the trainer fault has one to resume from
EXECUTOR_FAULT_STEP, TRAINER_FAULT_STEP, ENGINE_FAULT_STEP = 2, 5, 8  # the last in the restarted trainer


def manifest(tmp: Path) -> dict[str, Any]:
    """The example with its host paths under this test's directory."""
    text = EXAMPLE.read_text().replace(HOST_DIR, str(tmp))
    return yaml.safe_load(text)


def rewards(log: str) -> list[float]:
    return [float(m.group(2)) for m in STEP_LOG.finditer(log)]


def logged_steps(log: str) -> list[int]:
    return [int(m.group(1)) for m in STEP_LOG.finditer(log)]


def pod_logs(c: Cluster, ns: str, prefix: str) -> list[str]:
    """The logs of the pods named `<prefix>-*`, oldest pod first (each attempt's pod has its own file,
    and a replaced pod's log is never written after the pod's death: last-written order is age order)."""
    files = sorted((c.cache / "logs").glob(f"{ns}_{prefix}-*.log"), key=lambda p: p.stat().st_mtime_ns)
    return [p.read_text(errors="replace") for p in files]


def role_pods(c: Cluster, ns: str, role: str) -> list[dict[str, Any]]:
    sel = ",".join(f"{k}={v}" for k, v in L.role_selector(JOB, role).items())
    return [p for p in kjson(c, ns, "pods", "-l", sel)["items"] if not p["metadata"].get("deletionTimestamp")]


def running_pod(c: Cluster, ns: str, role: str, name_prefix: str = "") -> dict[str, Any]:
    """The one live pod of `role` (named `name_prefix`...) whose process the agent started."""
    def one() -> dict[str, Any] | None:
        pods = [p for p in role_pods(c, ns, role) if p["metadata"]["name"].startswith(name_prefix)
                and p["status"].get("phase") == "Running" and PID_ANNOTATION in (p["metadata"].get("annotations") or {})]
        return pods[0] if len(pods) == 1 else None

    return c.wait_for(one, timeout=120, interval=1, what=f"one running {role} pod {name_prefix}")


def kill_process(pod: dict[str, Any]) -> None:
    """SIGKILL the pod's process group, as a crash (or the OOM killer) would."""
    os.killpg(int(pod["metadata"]["annotations"][PID_ANNOTATION]), signal.SIGKILL)


def scrape(c: Cluster, url: str, timeout: float = 120.0) -> str:
    """GET `url` from inside the cluster's network namespace (pod addresses exist only there).

    Tried again until `timeout`, each failure's stderr kept for the report: the one GET this test
    made of the executor's metrics, right after the job succeeded (while the operator deletes
    its engine pods on the shared 2 cores), once failed in CI, and said no more than its exit status."""
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"

    def get() -> str:
        r = subprocess.run(c.in_netns([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"exit {r.returncode}: {r.stderr.strip()[-2000:]}")
        return r.stdout

    return c.wait_for(get, timeout=timeout, interval=2, what=f"GET {url}")


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*job=\"{JOB}\"[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in the executor's metrics:\n{text}"
    return float(m.group(1))


def fault_free_order(job: dict[str, Any]) -> list[list[int]]:
    """The prompts each step of a fault-free run trains: what the executor takes from the dataset."""
    r = job["spec"]["rollout"]
    ds = PromptDataset.from_path(str(REPO / r["dataset"]["path"]), label_field=None)
    return [sorted(p.index for p in ds.take(r["batchSize"])) for _ in range(job["spec"]["trainer"]["reference"]["steps"])]


@pytest.mark.timeout(2700)  # vLLM CPU start-up took 7 min on the shared 2 cores, and the engine fault starts one more
def test_apply_tiny_cluster_trains_through_executor_engine_and_trainer_kills_to_succeeded(
    podnet_cluster, loop_ns, tmp_path
):
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
    trainer_spec = job["spec"]["trainer"]
    trainer_spec["reference"]["saveEverySteps"] = SAVE_EVERY
    trainer_spec["maxRestarts"] = 1
    batches = tmp_path / "batches.jsonl"  # one line per (step, rank) batch received, both ranks, every attempt
    trainer_spec["env"] = [{"name": "RLJOB_BATCHES_FILE", "value": str(batches)}]
    steps = trainer_spec["reference"]["steps"]
    sa = trainer_spec["serviceAccountName"]
    control_service_account(c, ns, release, sa)

    watch = subprocess.Popen(
        c.in_netns(
            [str(c.bin_dir / "kubectl"), "--kubeconfig", str(c.kubeconfig), "-n", ns, "get", "rlj", "-w"]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def status() -> dict[str, Any]:
        return kjson(c, ns, "rlj", JOB).get("status", {})

    def phase() -> str:
        return status().get("phase", "")

    def all_logs() -> str:
        logs = {p.name: p.read_text(errors="replace") for p in (c.cache / "logs").glob(f"{ns}_*.log")}
        return "\n".join(f"== {k}\n{v[-3000:]}" for k, v in logs.items())

    def window_story() -> str:
        """The trainers' weight pushes and the operator's Events, every line of them: what a
        failed assertion on windows and cells needs (the tails of all_logs may have lost it)."""
        keep = re.compile(r"rljob_client\.trainer\.(loop|transport)|controller_client|controller_runtime\.fleet")
        files = sorted((c.cache / "logs").glob(f"{ns}_{JOB}-trainer-0-*.log")) + sorted(
            (c.cache / "logs").glob(f"{ns}_*operator*.log"))
        return "\n".join(f"{p.name}: {line[:300]}" for p in files
                         for line in p.read_text(errors="replace").splitlines() if keep.search(line))

    def rank0_reached(step: int, attempt: int = 0) -> None:
        """Wait until rank 0 of trainer attempt `attempt` has logged `step`.

        Steps take a second or two here, so this reads the log file alone, five times a second
        (the fault then lands within a step of the chosen one); the job's phase is looked at
        every few seconds only, so that a failed job ends the wait."""
        polls = iter(range(10**9))

        def reached() -> bool:
            if next(polls) % 25 == 24:
                assert phase() not in ("Succeeded", "Failed"), f"finished before step {step}:\n{all_logs()}"
            logs = pod_logs(c, ns, f"{JOB}-trainer-0")
            return len(logs) > attempt and step in logged_steps(logs[attempt])

        c.wait_for(reached, timeout=1200, interval=0.2, what=f"rank 0 of attempt {attempt} logged step {step}")

    try:
        c.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(job))

        # Fault 1: the executor pod is deleted; the Deployment makes a new one. (Each fault's pod
        # is looked up before its step comes, so that it lands right after that step.)
        old_executor = running_pod(c, ns, L.ROLE_ROLLOUT)
        rank0_reached(EXECUTOR_FAULT_STEP)
        c.kubectl("-n", ns, "delete", "pod", old_executor["metadata"]["name"], "--wait=false")
        new_executor = c.wait_for(
            lambda: next((p for p in role_pods(c, ns, L.ROLE_ROLLOUT)
                          if p["metadata"]["uid"] != old_executor["metadata"]["uid"]
                          and p["status"].get("podIP")), None),
            timeout=120, interval=1, what="the executor pod recreated",
        )

        # Fault 2: trainer rank 1 crashes once a checkpoint exists; the trainer Job is recreated.
        rank1 = running_pod(c, ns, L.ROLE_TRAINER, f"{JOB}-trainer-1-")
        rank0_reached(TRAINER_FAULT_STEP)  # checkpoints were saved after steps 1 and 3 (and 5)
        kill_process(rank1)

        # Fault 3: the engine dies (in the restarted trainer's run); the operator recreates its cell.
        engine = running_pod(c, ns, L.ROLE_ENGINE)
        rank0_reached(ENGINE_FAULT_STEP, attempt=1)
        kill_process(engine)

        c.wait_for(lambda: phase() in ("Succeeded", "Failed"), timeout=1800, interval=2, what="RLJob finished")
        row = c.kubectl("-n", ns, "get", "rlj", JOB).stdout
        text = c.kubectl("-n", ns, "describe", "rlj", JOB).stdout
        assert phase() == "Succeeded", f"{row}\n{text}\n{all_logs()}"
        try:
            executor_metrics = scrape(c, f"http://{new_executor['status']['podIP']}:10002/metrics")
        except WaitTimeout as e:
            raise AssertionError(f"{e}\n{all_logs()}") from e
        assert re.search(rf"^{JOB}\s+Succeeded\b", row.splitlines()[1]), row
        assert re.search(r"^  Phase:\s+Succeeded$", text, re.M), text
        final = status()
        assert final["trainerRestarts"] == 1, final
        # The engine's cell was recreated once, charged to its restart budget, and served again
        # after a later weight update. The kill lands between two windows (the probes find it) or
        # inside one (a step is ~1 s, a window ~0.1 s): then the trainer's abort finds the engine
        # dead (its port refuses) and leaves the cell to be healed like any dead one, not
        # recreated uncharged as a mere participant (the cell's own WindowAborted Event).
        events = kjson(c, ns, "events", "--field-selector", f"involvedObject.name={JOB}")["items"]
        replaced = [e["message"] for e in events if e["reason"] == "CellReplaced"]
        aborted = [e["message"] for e in events
                   if e["reason"] == "WindowAborted" and e["message"].startswith(f"[{JOB}-cell-0]")]
        assert len(replaced) == 1 and not aborted, f"{replaced}\n{aborted}\n{window_story()}"
        assert "generation 0 -> 1 (restart 1 of" in replaced[0], replaced
        served_at = [int(m.group(1)) for e in events if e["reason"] == "CellServing"
                     and (m := re.search(r"PendingWeights -> Serving: weights (\d+)", e["message"]))]
        assert max(served_at, default=-1) > ENGINE_FAULT_STEP, served_at  # the new cell, at a later version

        # The reward curve: every step trained, the last attempt's resumed ones included; it rose.
        rank0_logs = pod_logs(c, ns, f"{JOB}-trainer-0")
        assert len(rank0_logs) == 2, f"{len(rank0_logs)} rank-0 pods (one per attempt)"
        first, second = rank0_logs
        (resumed_at,) = [int(m.group(1)) for m in RESUMED_LOG.finditer(second)]
        first_steps = logged_steps(first)
        assert TRAINER_FAULT_STEP - 1 <= resumed_at <= max(first_steps) + 1, (resumed_at, first_steps)
        assert logged_steps(second) == list(range(resumed_at, steps)), second[-3000:]
        curve = [r for s, r in zip(first_steps, rewards(first), strict=True) if s < resumed_at] + rewards(second)
        print(f"\n[e2e] reward curve ({len(curve)} steps, resumed at {resumed_at}): {curve}")
        assert len(curve) == steps, (first_steps, logged_steps(second))
        assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3, curve

        # The executor fault: both ranks of the first attempt reconnected, to the new pod's side channel.
        for rank in (0, 1):
            (log0,) = pod_logs(c, ns, f"{JOB}-trainer-{rank}")[:1]
            hosts = [m.group(1) for m in RECONNECTED_LOG.finditer(log0)]
            # The last reconnect found the new pod (an earlier one may have reached the old pod still terminating).
            assert hosts and hosts[-1] == new_executor["status"]["podIP"], (rank, hosts, log0[-3000:])
        old_log, new_log = pod_logs(c, ns, f"{JOB}-rollout")[:2]
        for log, pod in ((old_log, old_executor), (new_log, new_executor)):
            (ready,) = READY_LOG.findall(log)
            assert json.loads(ready)["data_url"] == f"http://{pod['status']['podIP']}:10002", ready
        assert json.loads(READY_LOG.findall(new_log)[0])["resumed_from_rollout"] is not None, new_log[-3000:]

        # No prompt trained twice, none skipped: each step's two shards are disjoint and together the
        # prompts a fault-free run takes for that step; only the steps after the checkpoint were
        # trained a second time (by the restarted trainer), on the same prompts.
        expected = fault_free_order(job)
        seen: dict[tuple[int, int], list[list[int]]] = {}
        for line in batches.read_text().splitlines():
            b = json.loads(line)
            seen.setdefault((b["step"], b["rank"]), []).append(b["prompts"])
        for s in range(steps):
            got = [seen.get((s, rank), []) for rank in (0, 1)]
            assert all(got), (s, got)
            for shards in got:
                assert len(shards) == (1 if s < resumed_at else len(shards)) and len(shards) <= 2, (s, shards)
                assert all(x == shards[0] for x in shards), (s, shards)
            assert not set(got[0][0]) & set(got[1][0]), (s, got)
            assert sorted(got[0][0] + got[1][0]) == expected[s], (s, got, expected[s])

        # The new executor's metrics, from its side channel at the address it advertised.
        after_replacement = steps - EXECUTOR_FAULT_STEP - 2  # the old pod may have handed out one more rollout
        assert metric(executor_metrics, "rljob_executor_shards_served_total") >= 2 * after_replacement
        assert metric(executor_metrics, "rljob_executor_samples_generated_total") >= 64 * after_replacement
        assert metric(executor_metrics, "rljob_executor_max_staleness_versions") == 1
        assert metric(executor_metrics, "rljob_executor_batch_staleness_versions_count") >= 64 * after_replacement

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
