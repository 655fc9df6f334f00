"""Needless relist nudges when an operator restarts with many RLJobs (issue 14).

    .venv/bin/python bench/relist_nudges.py [--jobs 60] [--relist 2]

Against the test cluster of this worktree (tests/cluster/up first): N suspended RLJobs (a
daemon each, no pods) in a fresh namespace; one operator takes them all (every job counted in
its `rljob_reconcile_total`) and stops; a second one starts with `--relist SECONDS` and is timed
until it runs all N again. kopf spawns the daemons one after another, so for a while many jobs
have no runtime though kopf's watch delivered them: each annotation the relist writes then
(its "kopf missed an event" warning) is needless, since no watch event is lost here. Counted
from the second operator's log.

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.fixtures import running_cluster  # noqa: E402
from tests.cluster.waiting import wait_for  # noqa: E402
from tests.integration.operator_harness import (  # noqa: E402
    Kube,
    OperatorProcess,
    install_crd,
    make_rljob,
    release_rljobs,
)

NUDGE_LOG = "kopf missed an event of RLJob"
CHART = ("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
PASSES = re.compile(r'^rljob_reconcile_total\{[^}]*job="([^"]+)"', re.M)  # a series per job that made a pass


def jobs_running(op: OperatorProcess) -> int:
    """Jobs with a runtime that made a pass (a suspended job is not in `rljob_jobs`, which
    counts jobs with engines)."""
    return len(set(PASSES.findall(op.metrics())))


def run_all(
    cluster: Any, ns: str, logs: Path, identity: str, extra: tuple[str, ...], jobs: int
) -> tuple[float, OperatorProcess]:
    """Starts an operator and stops it once it runs every job: the seconds that took, and it
    (its log stays)."""
    t0 = time.monotonic()
    op = OperatorProcess(cluster, ns, logs, identity=identity, resync=10.0, extra_args=extra)
    try:
        wait_for(
            lambda: jobs_running(op) == jobs, 600, interval=0.5, what=f"operator {identity} runs every job"
        )
        return time.monotonic() - t0, op
    finally:
        op.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--relist", type=float, default=2.0, help="the second operator's --relist seconds")
    args = ap.parse_args()
    cluster = running_cluster()
    if cluster is None:
        print("no test cluster: run tests/cluster/up", file=sys.stderr)
        return 2
    install_crd(cluster)
    ns = cluster.create_namespace(f"bench-relist-{int(time.time())}")
    kube = Kube(cluster, ns)
    jobs = []
    for i in range(args.jobs):
        job = make_rljob(f"r{i:03d}", replicas=1)
        job["spec"]["suspend"] = True
        jobs.append(job)
    kube.apply({"apiVersion": "v1", "kind": "List", "items": jobs})
    logs = Path(tempfile.mkdtemp(prefix="relist-nudges-"))
    try:
        run_all(cluster, ns, logs, "op-a", CHART, args.jobs)
        all_running_s, second = run_all(
            cluster, ns, logs, "op-b", (*CHART, "--relist", str(args.relist)), args.jobs
        )
    finally:
        release_rljobs(cluster, ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    nudges = second.log_path.read_text(errors="replace").count(NUDGE_LOG)
    result = {
        "jobs": args.jobs,
        "relist_s": args.relist,
        "all_running_after_restart_s": round(all_running_s, 1),
        "needless_nudges": nudges,
    }
    print(json.dumps(result))
    print(
        f"relist_nudges: {args.jobs} jobs, --relist {args.relist:g}: all running {all_running_s:.1f} s after the "
        f"restart, {nudges} nudges written (none needed)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
