"""Failure to replacement on the test cluster: how fast the operator heals against its own health settings.

    .venv/bin/python bench/heal_bench.py [--settings 1x3 5x3 30x3] [--trials 20 20 5] [--faults kill hang]
                                         [--cells 8] [--kuberay-trials 20] [--kuberay-workers 4]
                                         [--kuberay-hang 30] [--json-out FILE] [--smoke]

The real operator (`rljob-operator`, its default resync) against the test cluster's real
kube-apiserver; engines are the stand-in processes run by the cluster's agent
(tests/engine_standin), one per cell. A fault is done to one cell's engine process:

  kill   SIGKILL: the process is gone, the agent fails its pod, probes are refused
  hang   SIGSTOP: the socket accepts, nothing answers (each probe waits timeoutSeconds)

and four moments are taken from watches of the RLJob and of the pods (receive time, one clock):
the fault, the cell Unhealthy (status.engines, or its next generation when a pass went
straight on), the replacement pod created (watch ADDED), the replacement PendingWeights.
Limit = intervalSeconds x failureThreshold (+ timeoutSeconds for a hang); the target is
p99(death -> PendingWeights) <= limit + 2 s. timeoutSeconds = intervalSeconds and
backoffSeconds = 0 (the backoff is a separate delay the user chooses; it adds to all of this).

Several cells of one job take faults per round, staggered over one probe interval so that each
meets a different probe phase; a round ends when every faulted cell is PendingWeights again.
For contrast, the same run then does the same SIGKILL (and SIGSTOP) to a worker of a RayCluster
reconciled by the real KubeRay operator in the same namespace (bench/heal_kuberay.py: what is
measured there and why it is comparable); `--kuberay-trials 0` leaves it out, and so does --smoke.
The environment variable RLJOB_TESTCLUSTER_* (as tests use them) picks the cluster; it is
brought up with tests/cluster/up when it is not running. Prints one JSON object, then a
one-line summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the cluster and operator harnesses live with the tests

from bench.benchcluster import bench_namespace, open_cluster  # noqa: E402
from bench.heal_common import follow, percentile, spread  # noqa: E402
from bench.heal_kuberay import run_kuberay  # noqa: E402
from tests.cluster.fixtures import Cluster  # noqa: E402
from tests.cluster.waiting import WaitTimeout  # noqa: E402
from tests.integration.operator_harness import (  # noqa: E402
    PID_ANNOTATION,
    STANDIN_DIR,
    Kube,
    OperatorProcess,
    free_port,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

GROUP, VERSION, PLURAL = "rljob.io", "v1alpha1", "rljobs"
SIGNALS = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}
UNHEALTHY_STATES = ("Unhealthy", "Failed")
BACK_STATES = ("PendingWeights", "Serving")
TARGET_SLACK_S = 2.0


@dataclass(frozen=True)
class Setting:
    interval: float
    threshold: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        i, _, t = text.partition("x")
        return cls(float(i), int(t))

    @property
    def name(self) -> str:
        return f"{self.interval:g}x{self.threshold}"

    def limit(self, fault: str) -> float:
        """What the spec promises: threshold probes one interval apart (+ the last one's timeout)."""
        return self.interval * self.threshold + (self.interval if fault == "hang" else 0.0)


@dataclass
class Trial:
    cell: str
    generation: int
    fault: str
    at: float  # monotonic time of the signal
    pid: int
    at_wall: float = 0.0  # the same moment on the wall clock (the operator's audit log)
    decided: float | None = None  # the controller marked it Unhealthy (audit log), monotonic
    unhealthy: float | None = None
    pod_created: float | None = None
    pending_weights: float | None = None
    skipped_unhealthy: bool = False  # status went from the old generation straight to the new one

    def seconds(self) -> dict[str, float | None]:
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.at, 3)

        return {"unhealthy_decided": since(self.decided), "unhealthy": since(self.unhealthy),
                "pod_created": since(self.pod_created), "pending_weights": since(self.pending_weights)}  # fmt: skip


@dataclass
class Recorder:
    """Watches of the RLJob and its engine pods, each event stamped on receipt (monotonic)."""

    cluster: Cluster
    namespace: str
    job: str
    cells: list[tuple[float, dict[str, tuple[int, str]]]] = field(default_factory=list)
    pods: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Recorder:
        for target in (self._watch_job, self._watch_pods):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch_job(self) -> None:
        from kubernetes import client

        api = client.CustomObjectsApi(self.cluster.api())

        def on_event(t: float, ev: dict[str, Any]) -> None:
            obj = ev["object"]
            if obj.get("metadata", {}).get("name") != self.job:
                return
            engines = (obj.get("status") or {}).get("engines") or []
            snap = {e["name"]: (int(e.get("generation", 0)), str(e.get("state"))) for e in engines}
            with self._lock:
                self.cells.append((t, snap))

        follow(self._stop, api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, on_event=on_event)

    def _watch_pods(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.cluster.api())

        def on_event(t: float, ev: dict[str, Any]) -> None:
            if ev["type"] == "ADDED":
                with self._lock:
                    self.pods.append((t, ev["object"].metadata.name))

        follow(self._stop, core.list_namespaced_pod, self.namespace, on_event=on_event,
                     label_selector=f"rljob.io/job={self.job},rljob.io/role=engine")  # fmt: skip

    def sees_pods_of(self, snap: dict[str, tuple[int, str]]) -> bool:
        """The pod watch has listed the current pod of every cell in `snap` (it is live)."""
        with self._lock:
            names = {name for _, name in self.pods}
        return bool(snap) and all(f"{cell}-g{gen}-0" in names for cell, (gen, _) in snap.items())

    def latest(self) -> dict[str, tuple[int, str]]:
        with self._lock:
            return dict(self.cells[-1][1]) if self.cells else {}

    def resolve(self, trial: Trial) -> bool:
        """Fill in the trial's moments from what the watches saw; True once it is back."""
        new_pod_prefix = f"{trial.cell}-g{trial.generation + 1}-"
        with self._lock:
            cells, pods = list(self.cells), list(self.pods)
        for t, snap in cells:
            if t < trial.at or trial.cell not in snap:
                continue
            gen, state = snap[trial.cell]
            if trial.unhealthy is None and (
                (gen == trial.generation and state in UNHEALTHY_STATES) or gen > trial.generation
            ):
                trial.unhealthy, trial.skipped_unhealthy = t, gen > trial.generation
            if gen == trial.generation + 1 and state in BACK_STATES:
                trial.pending_weights = t
                break
        if trial.pod_created is None:
            trial.pod_created = next((t for t, name in pods if t >= trial.at and name.startswith(new_pod_prefix)), None)
        return trial.pending_weights is not None


def summarize(trials: list[Trial], limit: float, engine_start: float = 0.0) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": len(trials), "limit_s": limit}
    for part in ("unhealthy_decided", "unhealthy", "pod_created", "pending_weights"):
        values = [v for v in (tr.seconds()[part] for tr in trials) if v is not None]
        out[part] = spread(values)
        if out[part] is not None:
            out[part].update(p50_ratio_to_limit=round(statistics.median(values) / limit, 3),
                             p99_ratio_to_limit=round(percentile(values, 99) / limit, 3))  # fmt: skip
    pw = out.get("pending_weights")
    out["target_s"] = limit + TARGET_SLACK_S
    out["target_met"] = bool(pw and pw["p99_s"] <= limit + TARGET_SLACK_S)
    # The replacement's own start-up (a lone stand-in, measured in the same run) is the engine's, not
    # the operator's: the operator's part is met when what is left of p99 is within the target.
    out["engine_start_s"] = engine_start
    out["target_met_less_engine_start"] = bool(pw and pw["p99_s"] - engine_start <= limit + TARGET_SLACK_S)
    out["skipped_unhealthy"] = sum(tr.skipped_unhealthy for tr in trials)
    out["raw_s"] = [tr.seconds() for tr in trials]
    return out


def read_decisions(log_path: Path, trials: list[Trial]) -> None:
    """When the controller marked each trial's cell Unhealthy: its audit lines in the operator's log
    (wall clock, ms), so the moment is the decision, not the later status write the watch sees."""
    marks: list[tuple[float, str, int]] = []
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{") or '"cell_transition"' not in line:
            continue
        with contextlib.suppress(ValueError, KeyError):
            rec = json.loads(line)
            if rec.get("to") in UNHEALTHY_STATES:
                ts = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
                marks.append((ts, rec["source"]["cell"], int(rec["generation"])))
    for tr in trials:
        hit = next((ts for ts, cell, gen in marks if cell == tr.cell and gen == tr.generation and ts >= tr.at_wall - 0.01), None)
        if hit is not None:
            tr.decided = tr.at + (hit - tr.at_wall)


def heal_job(name: str, setting: Setting, cells: int) -> dict[str, Any]:
    job = make_rljob(name, replicas=cells, standin_cells="all", max_restarts=1000, backoff=0, max_backoff=0,
                     startup_deadline=300)  # fmt: skip
    job["spec"]["inference"]["healthCheck"].update(
        intervalSeconds=setting.interval, timeoutSeconds=setting.interval, failureThreshold=setting.threshold
    )
    return job


def engine_pid(kube: Kube, cell: str, generation: int) -> int:
    pod = f"{cell}-g{generation}-0"
    return int(wait_for(lambda: ((kube.get("pod", pod) or {}).get("metadata", {}).get("annotations") or {})
                        .get(PID_ANNOTATION), 60, what=f"pid of {pod}"))  # fmt: skip


def run_setting(cluster: Cluster, namespace: str, log_dir: Path, setting: Setting, faults: list[str],
                trials: int, cells: int, per_round: int, engine_start: float) -> dict[str, Any]:  # fmt: skip
    """One job with `cells` cells under one operator; `trials` faults of each kind, in rounds."""
    kube = Kube(cluster, namespace)
    name = f"heal-{setting.name.replace('.', '-')}".lower()
    op = OperatorProcess(cluster, namespace, log_dir, identity=f"heal-{uuid.uuid4().hex[:4]}", resync=10.0)
    rec = Recorder(cluster, namespace, name).start()
    results: dict[str, Any] = {}
    stopped: list[int] = []
    try:
        kube.apply(heal_job(name, setting, cells))
        wait_for(lambda: kube.status(name).get("ready") == f"{cells}/{cells}", 180, what=f"{name}: all cells serving")
        # The pod watch starts on its own thread and, on a loaded machine, has been seen to list its
        # first pods only after a first fault: a replacement created before it lists would be missed.
        wait_for(lambda: rec.sees_pods_of(rec.latest()), 60, interval=0.2, what=f"{name}: the pod watch sees every cell")
        per_round = min(cells, trials, per_round)
        for fault in faults:
            done: list[Trial] = []
            stuck: list[dict[str, Any]] = []  # faulted cells that never came back: reported, not waited for forever
            while len(done) < trials and not stuck:
                k = min(per_round, trials - len(done))
                snap = rec.latest()
                first = (len(done) // k * k) % cells  # rotate through the cells round by round
                targets = [sorted(snap)[(first + j) % cells] for j in range(k)]
                pids = {c: engine_pid(kube, c, snap[c][0]) for c in targets}
                round_start = time.monotonic()
                batch: list[Trial] = []
                for j, cell in enumerate(targets):  # staggered over one interval: each meets another probe phase
                    delay = round_start + j * setting.interval / k - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    at, at_wall = time.monotonic(), time.time()
                    os.kill(pids[cell], SIGNALS[fault])
                    if fault == "hang":
                        stopped.append(pids[cell])
                    batch.append(Trial(cell, snap[cell][0], fault, at, pids[cell], at_wall))
                budget = setting.limit(fault) + setting.interval + 120
                try:
                    wait_for(lambda b=batch: all(rec.resolve(tr) for tr in b), budget, interval=0.5,
                             what=f"{fault} round of {name}: every faulted cell PendingWeights again")  # fmt: skip
                except WaitTimeout:
                    stuck = [{"cell": tr.cell, "generation": tr.generation, "last": rec.latest().get(tr.cell),
                              **tr.seconds()} for tr in batch if not rec.resolve(tr)]  # fmt: skip
                    print(f"heal_bench: {name} {fault}: not back after {budget:.0f} s: {stuck}", file=sys.stderr)
                done += [tr for tr in batch if tr.pending_weights is not None]
            read_decisions(op.log_path, done)
            results[fault] = summarize(done, setting.limit(fault), engine_start)
            results[fault]["stuck"] = stuck
            if stuck:  # a cell that never came back is past every limit
                results[fault]["target_met"] = results[fault]["target_met_less_engine_start"] = False
    finally:
        rec.stop()
        for pid in stopped:  # a stopped engine the agent has not reaped yet
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        op.stop()
        cluster.kubectl("delete", "rljob", name, "-n", namespace, "--wait=false", check=False)
        release_rljobs(cluster, namespace)
    return results


def engine_start_seconds(runs: int = 3) -> list[float]:
    """Spawn -> first /health answer of one stand-in engine on loopback, alone: what a replacement's
    own start-up costs on this machine, apart from the operator (the pod's process, the same argv)."""
    out = []
    for _ in range(runs):
        port = free_port()
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(STANDIN_DIR / "rljob_engine_standin.py"), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_for(lambda p=port: urllib.request.urlopen(f"http://127.0.0.1:{p}/health", timeout=1).status == 200,
                     60, interval=0.05, what="stand-in engine answering")  # fmt: skip
            out.append(round(time.monotonic() - started, 3))
        finally:
            proc.kill()
            proc.wait(timeout=10)
    return out


def bench(cluster: Cluster, namespace: str, settings: list[Setting], trials: list[int], faults: list[str],
          cells: int, log_dir: str | None = None, per_round: int = 4, engine_starts: int = 3,
          kuberay_trials: int = 0, kuberay_workers: int = 4, kuberay_hang_s: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """The RLJob side for every setting, then (kuberay_trials > 0) the KubeRay side in the same namespace."""
    install_crd(cluster)
    starts = engine_start_seconds(engine_starts)
    out: dict[str, Any] = {"cells": cells, "faults": faults, "per_round": per_round, "settings": {},
                           "engine_start_s": starts}  # fmt: skip
    if log_dir:  # the operator's log is opened there, so it has to exist (it was not made before)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="heal-bench-") as d:
        for setting, n in zip(settings, trials, strict=True):
            started = time.monotonic()
            res = run_setting(cluster, namespace, Path(log_dir or d), setting, faults, n, cells, per_round,
                              statistics.median(starts))  # fmt: skip
            res["wall_s"] = round(time.monotonic() - started, 1)
            out["settings"][setting.name] = res
            print(f"heal_bench: {setting.name} done: {json.dumps(res)}", file=sys.stderr, flush=True)
        if kuberay_trials > 0:
            out["kuberay"] = run_kuberay(cluster, namespace, Path(log_dir or d), kuberay_trials, kuberay_workers,
                                         kuberay_hang_s)  # fmt: skip
            print(f"heal_bench: KubeRay done: {json.dumps(out['kuberay'])}", file=sys.stderr, flush=True)
    return out


def summary_line(result: dict[str, Any]) -> str:
    parts = []
    for name, res in result["settings"].items():
        for fault in result["faults"]:
            r = res[fault]
            pw = r["pending_weights"]
            if not pw or r.get("stuck"):
                parts.append(f"{name} {fault}: {len(r.get('stuck') or [])} cell(s) STUCK after {r['trials']} trials")
                if not pw:
                    continue
            parts.append(f"{name} {fault} p50 {pw['p50_s']:.1f} s p99 {pw['p99_s']:.1f} s (limit {r['limit_s']:g} s, "
                         f"{'met' if r['target_met'] else 'MISSED'}; less the engine's start-up "
                         f"{'met' if r['target_met_less_engine_start'] else 'MISSED'})")  # fmt: skip
    line = "heal_bench: death -> PendingWeights: " + "; ".join(parts)
    kr = result.get("kuberay")
    if kr and "kill" in kr:
        k, hang = kr["kill"], kr.get("hang")
        line += (f" | KubeRay worker SIGKILL -> replacement serving p50 {k['serving']['p50_s']:.1f} s "
                 f"p99 {k['serving']['p99_s']:.1f} s ({k['trials']} trials)")  # fmt: skip
        if hang:
            line += f", SIGSTOP: reaction {hang['reaction']} in {hang['window_s']:g} s"
    elif kr:
        line += f" | KubeRay: {kr.get('not_run')}"
    return line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=["1x3", "5x3", "30x3"], help="intervalSeconds x failureThreshold")
    p.add_argument("--trials", type=int, nargs="+", default=[20, 20, 5], help="faults of each kind per setting")
    p.add_argument("--faults", nargs="+", default=["kill", "hang"], choices=sorted(SIGNALS))
    p.add_argument("--cells", type=int, default=8, help="cells of the job")
    p.add_argument("--per-round", type=int, default=4, help="cells faulted per round, staggered over one interval")
    p.add_argument("--engine-starts", type=int, default=3, help="lone stand-in start-ups timed for engine_start_s")
    p.add_argument("--kuberay-trials", type=int, default=20, help="KubeRay side: worker kills (0: no KubeRay side)")
    p.add_argument("--kuberay-workers", type=int, default=4, help="KubeRay side: workers of the RayCluster")
    p.add_argument("--kuberay-hang", type=float, default=30.0, help="KubeRay side: seconds a SIGSTOPped worker is watched")
    p.add_argument("--smoke", action="store_true", help="one kill and one hang at 1x2 on 2 cells, no KubeRay side "
                   "(what CI runs: KubeRay's start and CRD checks alone cost ~20 s here)")  # fmt: skip
    p.add_argument("--json-out")
    p.add_argument("--log-dir", help="keep the operator's logs here")
    args = p.parse_args()
    if args.smoke:
        args.settings, args.trials, args.cells, args.engine_starts = ["1x2"], [1], 2, 1
        args.kuberay_trials = 0
    if len(args.trials) == 1:
        args.trials = args.trials * len(args.settings)
    started = time.time()
    cluster = open_cluster()
    with bench_namespace(cluster, "heal-bench") as ns:
        result = bench(cluster, ns, [Setting.parse(s) for s in args.settings], args.trials, args.faults, args.cells, args.log_dir,
                       args.per_round, args.engine_starts, args.kuberay_trials, args.kuberay_workers,
                       args.kuberay_hang)  # fmt: skip
    result["wall_s"] = round(time.time() - started, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
