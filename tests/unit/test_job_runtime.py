"""JobRuntime passes on the fake ports: status writes, restore, suspend, TTL. Logic only:
tests/integration/test_operator*.py run the same code against a real API server."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from rljob_operator.child_versions import MAX_AGE_SECONDS, WATCHED_KINDS, ChildVersions
from rljob_operator.conditions import find
from rljob_operator.job_gauges import job_samples
from rljob_operator.kube.kubeapi import NotFound
from rljob_operator.manifests import PolicyPeers
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.job_runtime import JobRuntime
from rljob_operator.registry import VERB_PUBLISHES, JobRegistry

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.clock import FakeClock, iso
from controller_runtime.fakes import FakeEngines, FakePlatform
from controller_runtime.health import STARTING_PROBE_SECONDS


class FakeKube:
    """Records what the runtime writes; the status patch is merged like the API server does."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.applied: list[dict[str, Any]] = []
        self.created: dict[str, dict[str, Any]] = {}  # create_if_absent: first object per name
        self.stored: dict[str, dict[str, Any]] = {}  # applied children as the API server keeps them
        self.reads: list[str] = []
        self.platform: FakePlatform | None = None
        self.fresh: dict[str, Any] | None = None  # what a GET of the RLJob answers (None: `body`)
        self.rljob_gets = 0
        self.work_waiting = False  # what KubeApi.has_work_waiting answers
        self.version = 0  # the last resourceVersion an apply stored
        # the user's trainer workloads (workloadRef) by name; None: the API server does not serve the kind
        self.workloads: dict[str, dict[str, Any]] | None = {"mine": {"status": {}}}

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        stored = copy.deepcopy(obj)
        self.version += 1
        stored["metadata"]["resourceVersion"] = str(self.version)  # what the server adds is not drift
        self.stored[f"{obj['kind']}/{obj['metadata']['name']}"] = stored
        return copy.deepcopy(stored)

    def has_work_waiting(self) -> bool:
        return self.work_waiting

    async def get_stored(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        self.reads.append(key)
        return copy.deepcopy(self.stored.get(key))

    async def create_if_absent(self, obj: dict[str, Any]) -> bool:
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in self.created:
            return False
        self.created[key] = obj
        self.applied.append(obj)
        return True

    async def delete_job(self, ns: str, name: str) -> None:
        pass

    async def patch_rljob_status(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        merged = dict(self.body.get("status") or {})
        for k, v in status.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = copy.deepcopy(v)
        self.body["status"] = merged
        return copy.deepcopy(self.body)

    async def create_event(self, involved, type_, reason, message, now, action="Reconcile") -> None:
        self.events.append((type_, reason, message))

    async def get_job(self, ns: str, name: str) -> dict[str, Any] | None:
        return None

    async def get_workload(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        if self.workloads is None:
            raise NotFound(f"GET {kind}", 404, "NotFound", '{"details": {}}')
        return copy.deepcopy(self.workloads.get(name))

    async def get_rljob(self, ns: str, name: str) -> dict[str, Any] | None:
        self.rljob_gets += 1
        return copy.deepcopy(self.fresh if self.fresh is not None else self.body)

    async def count_pods(self, ns: str, selector: str) -> int:
        return len(self.platform.cells) if self.platform else 0

    async def delete_rljob(self, ns: str, name: str, uid: str | None = None) -> None:
        self.deleted.append(name)


class NeverStopped:
    """kopf's DaemonStopped as long as nobody stops the daemon."""

    def __bool__(self) -> bool:
        return False

    async def wait(self) -> None:
        await asyncio.Event().wait()


def rljob(replicas: int = 2, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "job", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": {
            "model": {"path": "/models/tiny"},
            "inference": {"replicas": replicas, "gpusPerEngine": 0,
                          "healthCheck": {"intervalSeconds": 1, "failureThreshold": 2}},
            "rollout": {"dataset": {"path": "/data/p.jsonl"}},
            "trainer": {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "mine"}},
            **spec,
        },
    }


def runtime(body: dict[str, Any], platform: FakePlatform, clock: FakeClock, registry: JobRegistry | None = None,
            engines: FakeEngines | None = None, children: ChildVersions | None = None):
    kube = FakeKube(body)
    kube.platform = platform
    rt = JobRuntime(body=body, kube=kube, platform=platform, registry=registry or JobRegistry(),
                    metrics=Metrics(), controller_url="http://op:8080", resync_seconds=5, clock=clock,
                    engines=engines or FakeEngines(), child_versions=children)
    return rt, kube, kube.applied


async def settle(rt: JobRuntime, passes: int = 4) -> None:
    for _ in range(passes):
        await rt.run_pass()
    await rt.recorder.flush()


async def test_passes_bring_the_fleet_to_ready_and_write_status_and_events():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, applied = runtime(body, platform, clock)
    rt.recorder.start()
    await settle(rt)
    st = body["status"]
    assert st["ready"] == "2/2" and st["phase"] == "Running" and st["observedGeneration"] == 1
    assert find(st["conditions"], "Ready")["status"] == "True"
    kinds = sorted(o["kind"] for o in applied)
    # executor; headless, engines, rollout; the Ray token; rollout and engine ingress policies
    assert kinds == [
        "Deployment",
        "NetworkPolicy",
        "NetworkPolicy",
        "Secret",
        "Service",
        "Service",
        "Service",
    ]
    assert [o["kind"] for o in applied].index("Secret") < [o["kind"] for o in applied].index("Deployment")
    reasons = {r for _, r, _ in kube.events}
    assert {"CellServing", "AllEnginesServing"} <= reasons
    n = len(kube.patches)
    await rt.run_pass()
    assert len(kube.patches) == n  # nothing changed: nothing written
    await rt.recorder.close()


async def test_a_job_without_rollout_is_its_engine_fleet_alone_no_executor_service_policy_or_token():
    """spec.rollout left out (a workloadRef trainer that generates by itself): the job becomes
    Ready on its engines, and the operator makes nothing of the executor's: no Deployment, no
    `<job>-rollout` Service, no rollout policy, no Ray token Secret (issue 13's fleet benchmark
    measures exactly this job)."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    del body["spec"]["rollout"]
    rt, _, applied = runtime(body, platform, clock)
    rt.recorder.start()
    await settle(rt)
    st = body["status"]
    assert st["ready"] == "2/2" and st["phase"] == "Running"
    assert find(st["conditions"], "Ready")["status"] == "True"
    assert sorted((o["kind"], o["metadata"]["name"]) for o in applied) == [
        ("NetworkPolicy", "job-engine-ingress"),
        ("Service", "job-cells"),
        ("Service", "job-engines"),
    ]
    await rt.recorder.close()


async def test_a_pass_validates_the_spec_once_and_the_next_pass_sees_an_edit(monkeypatch):
    """Every step, manifest and the status write read the spec; each read validated it anew
    (~90 us each, a dozen per pass: a quarter of the event loop at steady state with 300 jobs).
    Once per pass was still a fifth of the loop at 1,000 jobs: a spec is validated once."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    await settle(rt)
    validated: list[Any] = []
    real = RLJobSpec.model_validate.__func__  # type: ignore[attr-defined]

    def counting(cls, obj, *args, **kwargs):
        validated.append(obj)
        return real(cls, obj, *args, **kwargs)

    monkeypatch.setattr(RLJobSpec, "model_validate", classmethod(counting))
    await rt.run_pass()
    await rt.run_pass()
    assert validated == [], "the same spec: validated once, before, and kept across passes"
    body["spec"]["inference"]["replicas"] = 3  # edited in place, as no watch would: still seen
    await rt.run_pass()
    assert len(validated) == 1 and rt.effective_spec().inference.replicas == 3
    await rt.run_pass()
    assert len(validated) == 1


async def test_a_new_runtime_restores_cells_and_the_open_lock_from_status():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    await settle(rt)
    window = await rt.controller.start_update_weights("trainer-0")
    await rt.publish("start_update_weights")
    created = len(platform.created)

    rt2, _, _ = runtime(body, platform, clock)  # the operator restarted: same cluster, same status
    await settle(rt2)
    assert rt2.controller.lock.current is not None and rt2.controller.lock.current.holder == "trainer-0"
    assert len(platform.created) == created  # no duplicate cells
    await rt2.controller.end_update_weights(window.snapshot, weight_version="2")
    await rt2.publish("end")
    assert body["status"]["weightVersion"] == "2" and "lock" not in body["status"]


async def test_a_restart_handed_a_stale_rljob_acts_on_the_stored_spec_and_status():
    """kopf's start-up LIST may come from a lagging cache: the restarted runtime's body is the job
    at generation 1 (1 replica, no status) while it is stored at generation 2 (2 replicas)
    with a weight version. The first pass reads the RLJob afresh: no cell is deleted, the
    weight version and observedGeneration are kept."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob(replicas=1)
    stale = copy.deepcopy(body) | {"metadata": {**body["metadata"], "resourceVersion": "5"}}
    rt, _, _ = runtime(body, platform, clock)
    await settle(rt)
    body["spec"]["inference"]["replicas"] = 2
    body["metadata"]["generation"] = 2
    await settle(rt)
    window = await rt.controller.start_update_weights("trainer-0")
    await rt.controller.end_update_weights(window.snapshot, weight_version="7")
    await rt.publish("end")
    body["metadata"]["resourceVersion"] = "40"
    assert len(platform.cells) == 2 and body["status"]["weightVersion"] == "7"
    cells = dict(platform.cells)

    rt2, kube2, _ = runtime(stale, platform, clock)  # restarted, handed the old body
    kube2.fresh = body
    await settle(rt2)
    assert platform.cells == cells and platform.deleted == []
    assert kube2.rljob_gets == 1  # once, before the first pass acts, not every pass
    assert rt2.stored_status["weightVersion"] == "7" and rt2.stored_status["observedGeneration"] == 2
    assert rt2.stored_status["ready"] == "2/2"


async def test_a_runtime_whose_rljob_is_gone_at_start_ends_without_acting():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, applied = runtime(body, platform, clock)
    kube.fresh = {"metadata": {**body["metadata"], "uid": "u-2"}, "spec": body["spec"]}  # a namesake
    await asyncio.wait_for(rt.run(NeverStopped()), 10)  # returns: the loop ended on its own
    assert platform.created == [] and applied == [] and kube.patches == []


async def test_replicas_change_is_reconciled_live():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    await settle(rt)
    body["spec"]["inference"]["replicas"] = 3
    body["metadata"]["generation"] = 2
    await settle(rt)
    assert body["status"]["ready"] == "3/3" and body["status"]["observedGeneration"] == 2


async def test_suspend_deletes_engines_and_resume_recreates_them_pending_weights():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    registry = JobRegistry()
    rt, _, _ = runtime(body, platform, clock, registry)
    await settle(rt)
    body["status"]["weightVersion"] = "3"  # a weight update happened before the suspend
    rt.stored_status["weightVersion"] = "3"
    body["spec"]["suspend"] = True
    await settle(rt, 2)
    st = body["status"]
    assert platform.cells == {} and rt.controller is None and registry.get("ns", "job") is None
    assert st["phase"] == "Suspended" and st["engines"] == [] and st["ready"] == "0/2"
    assert find(st["conditions"], "Suspended")["status"] == "True"
    body["spec"]["suspend"] = False
    await settle(rt)
    assert len(platform.cells) == 2
    assert {e["state"] for e in body["status"]["engines"]} == {"PendingWeights"}
    assert find(body["status"]["conditions"], "Suspended")["status"] == "False"


async def test_finished_job_is_deleted_after_its_ttl():
    clock, platform, body = FakeClock(), FakePlatform(), rljob(ttlSecondsAfterFinished=60)
    rt, kube, _ = runtime(body, platform, clock)
    await settle(rt)
    body["status"]["phase"] = rt.stored_status["phase"] = "Succeeded"
    body["status"]["completionTime"] = rt.stored_status["completionTime"] = iso(clock.now())
    delay = await rt.run_pass()
    assert (platform.cells == {} and kube.deleted == [] and 55 <= delay <= 60) or delay == rt.resync_seconds
    await clock.advance(61)
    await rt.run_pass()
    assert kube.deleted == ["job"]


async def test_standby_runtime_takes_no_action():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, applied = runtime(body, platform, clock)
    rt.acting = lambda: False
    await settle(rt)
    assert platform.created == [] and kube.patches == [] and applied == []


async def test_a_trainer_job_whose_pod_template_is_refused_is_deleted_and_recreated():
    from rljob_operator.kube.kubeapi import api_error

    clock, platform = FakeClock(), FakePlatform()
    body = rljob()
    body["spec"]["trainer"] = {"replicas": 1, "gpusPerReplica": 0}
    rt, kube, applied = runtime(body, platform, clock)
    refused: list[str] = []
    deleted: list[str] = []
    record = kube.apply

    async def apply(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Job" and not refused:
            refused.append(obj["metadata"]["name"])
            raise api_error("PATCH job", 422, "Unprocessable Entity", '{"message": "field is immutable"}')
        return await record(obj)

    async def delete_job(ns: str, name: str) -> None:
        deleted.append(name)

    kube.apply, kube.delete_job = apply, delete_job
    rt.recorder.start()
    await rt.run_pass()
    await rt.recorder.flush()
    assert refused == deleted == ["job-trainer"]
    assert [o["metadata"]["name"] for o in applied if o["kind"] == "Job"] == ["job-trainer"]
    assert "TrainerRecreated" in {r for _, r, _ in kube.events}
    await rt.recorder.close()


async def test_a_failing_engine_pass_is_reported_as_a_reconcile_error_and_recovers():
    """The controller's pass logs and swallows its errors (local mode keeps running); the
    operator must still tell the user: a ReconcileError Event naming what failed, the
    reconcile-errors metric, and no status written over the failure."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, _ = runtime(body, platform, clock)
    rt.recorder.start()
    platform.fail_create = True
    await rt.run_pass()
    await rt.recorder.flush()
    warnings = [(r, m) for t, r, m in kube.events if t == "Warning"]
    assert [r for r, _ in warnings] == ["ReconcileError"], kube.events
    assert "EnginePassFailed: reconcile: RuntimeError: fake platform: create refused" in warnings[0][1]
    errors = rt.metrics.reconcile_errors.labels("ns", "job", "pass")._value.get()
    assert errors == 1
    platform.fail_create = False
    await settle(rt)
    assert body["status"]["ready"] == "2/2"
    await rt.recorder.close()


def store_trainer_job(kube: FakeKube, failed: dict[str, Any]) -> list[str]:
    """The trainer Job as the API server keeps it, starting `failed`: a delete removes it, the
    next apply after that creates a fresh (running) one. Returns the names deleted, in order."""
    stored: list[dict[str, Any] | None] = [failed]
    deleted: list[str] = []

    async def get_job(ns: str, name: str) -> dict[str, Any] | None:
        return stored[-1]

    async def delete_job(ns: str, name: str) -> None:
        deleted.append(name)
        stored.append(None)

    record = kube.apply

    async def apply(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Job" and stored[-1] is None:
            stored.append({"metadata": obj["metadata"], "status": {}})
        return await record(obj)

    kube.get_job, kube.delete_job, kube.apply = get_job, delete_job, apply
    return deleted


async def test_a_failed_trainer_job_is_recreated_as_the_next_attempt_and_counted_in_status():
    clock, platform = FakeClock(), FakePlatform()
    body = rljob()
    body["spec"]["trainer"] = {"replicas": 2, "gpusPerReplica": 0, "reference": {"saveEverySteps": 2}}
    rt, kube, applied = runtime(body, platform, clock)
    failed = {
        "metadata": {"annotations": {"rljob.io/trainer-attempt": "0"}},
        "status": {
            "failedIndexes": "1",
            "conditions": [{"type": "Failed", "status": "True", "reason": "MaxFailedIndexesExceeded"}],
        },
    }
    deleted = store_trainer_job(kube, failed)
    rt.recorder.start()
    await rt.run_pass()
    await rt.run_pass()
    await rt.recorder.flush()
    assert deleted == ["job-trainer"]  # once: the second pass sees attempt 1 running
    jobs = [o for o in applied if o["kind"] == "Job"]
    assert {o["metadata"]["annotations"]["rljob.io/trainer-attempt"] for o in jobs} == {"1"}
    status = kube.body["status"]
    assert status["trainerRestarts"] == 1 and status["phase"] != "Failed"
    restarted = [m for _, r, m in kube.events if r == "TrainerRestarted"]
    assert len(restarted) == 1 and "failed rank: 1" in restarted[0] and "restart 1 of 3" in restarted[0]
    await rt.recorder.close()


async def test_a_trainer_failing_again_is_restarted_only_after_its_backoff_and_the_job_says_so():
    """Restart 2 waits 10 s after the failure (restart 1 was at once): a crash loop cannot spend
    the budget in seconds. Meanwhile the failed Job stays, the job is not Failed, one Event says why."""
    clock, platform = FakeClock(), FakePlatform()
    body = rljob()
    body["spec"]["trainer"] = {"replicas": 1, "gpusPerReplica": 0, "reference": {"saveEverySteps": 2}}
    rt, kube, applied = runtime(body, platform, clock)
    failed = {
        "metadata": {"annotations": {"rljob.io/trainer-attempt": "1"}},
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                   "lastTransitionTime": iso(clock.now() - 3)}]},
    }
    deleted = store_trainer_job(kube, failed)
    rt.recorder.start()
    await rt.run_pass()
    await rt.run_pass()
    await rt.recorder.flush()
    assert deleted == []
    assert kube.body["status"]["phase"] != "Failed"
    backoff = [m for _, r, m in kube.events if r == "TrainerRestartBackoff"]
    assert len(backoff) == 1 and "restart 2 of 3 after a backoff of 10 s" in backoff[0], kube.events
    assert {o["metadata"]["annotations"]["rljob.io/trainer-attempt"] for o in applied if o["kind"] == "Job"} <= {"1"}

    await clock.advance(8)  # 11 s after the failure
    await rt.run_pass()
    await rt.recorder.flush()
    assert deleted == ["job-trainer"]
    assert [o["metadata"]["annotations"]["rljob.io/trainer-attempt"] for o in applied if o["kind"] == "Job"][-1] == "2"
    assert kube.body["status"]["trainerRestarts"] == 2
    assert len([m for _, r, m in kube.events if r == "TrainerRestarted"]) == 1
    await rt.recorder.close()


async def test_the_ray_token_secret_is_made_once_and_never_rotated_by_a_resync():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, applied = runtime(body, platform, clock)
    await settle(rt)
    token = kube.created["Secret/job-ray-auth"]["data"]["token"]
    await clock.advance(120)  # past the children's resync: everything is applied again
    await settle(rt, passes=2)
    assert kube.created["Secret/job-ray-auth"]["data"]["token"] == token
    assert [o["kind"] for o in applied].count("Secret") == 1
    assert token not in repr(body.get("status")) and all(token not in m for _, _, m in kube.events)


async def test_a_window_opened_by_the_api_does_not_wake_a_pass_a_probe_verdict_does():
    """The verb writes status itself before it answers; an early pass would hold the fleet's mutex
    while the trainer's next call waits. A verdict applied off the pass must wake one."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _kube, _ = runtime(body, platform, clock)
    await settle(rt)
    rt._wake.clear()
    window = await rt.controller.start_update_weights("trainer")
    assert not rt._wake.is_set()
    await rt.controller.end_update_weights(window.snapshot, "1")
    assert rt._wake.is_set()  # a closed window: deferred replacements may be due
    rt._wake.clear()
    platform.fail_pod(f"{body['metadata']['name']}-cell-0")
    await rt.run_pass()
    assert rt._wake.is_set()  # a cell turned Unhealthy

async def test_what_a_status_writing_verb_announces_wakes_a_pass_only_when_a_cell_waits_for_one():
    """Inside a controller API verb that writes status (the window's end, an onload), its own
    write publishes what changed: a pass woken by it only held the fleet's mutex while the
    trainer's next call waited (issue 13: up to 77 ms of a window). A cell that waits for its
    pods (found dead while the window was open) still gets its pass at once."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _kube, _ = runtime(body, platform, clock)
    await settle(rt)
    in_verb = VERB_PUBLISHES.set(True)
    try:
        window = await rt.controller.start_update_weights("trainer")
        rt._wake.clear()
        await rt.controller.end_update_weights(window.snapshot, "1")
        assert not rt._wake.is_set()  # every cell serves: nothing for a pass
        await rt.controller.offload()
        await rt.controller.onload()
        assert not rt._wake.is_set()  # the cells back from offload: published by onload
        window = await rt.controller.start_update_weights("trainer")
        platform.fail_pod(f"{body['metadata']['name']}-cell-0")
        VERB_PUBLISHES.reset(in_verb)
        await rt.run_pass()  # the pass during the window sees the pod fail; replacement waits for the end
        in_verb = VERB_PUBLISHES.set(True)
        rt._wake.clear()
        await rt.controller.end_update_weights(window.snapshot, "2")
        assert rt._wake.is_set()  # cell-0 waits for its replacement
    finally:
        VERB_PUBLISHES.reset(in_verb)


async def test_probes_that_change_nothing_write_no_status():
    """Every probe moves a cell's lastProbeTime; written each time, 1,000 healthy jobs cost the
    API server a status patch per job per probe interval (issue 13). Nothing else changed: nothing
    is written, and the probe-age gauge still follows the probes."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, _ = runtime(body, platform, clock)
    await settle(rt)
    assert body["status"]["ready"] == "2/2"
    written, probed = len(kube.patches), body["status"]["engines"][0].get("lastProbeTime")
    for _ in range(5):  # five probe intervals
        await clock.advance(1)
        await rt.run_pass()
    assert len(kube.patches) == written
    live = rt.metrics.job_gauges.jobs[("ns", "job")].status["engines"][0]["lastProbeTime"]
    assert live != probed and live == iso(clock.now())
    platform.fail_pod("job-cell-1")  # a real change goes out, with the probe times it carries
    await settle(rt, passes=2)
    assert len(kube.patches) > written


async def test_a_failed_probe_below_the_threshold_writes_no_status_the_threshold_does():
    """Under load probes time out; writing each failure below `failureThreshold` (and the success
    that resets it) was 517-634 status patches of an N=1,000 ramp, on the API server that was its
    bottleneck (issue 13). Such a failure changes no state and writes nothing; the live count is a
    gauge; the threshold's verdict is written with the count."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    body["spec"]["inference"]["healthCheck"]["failureThreshold"] = 3
    engines = FakeEngines()
    rt, kube, _ = runtime(body, platform, clock, engines=engines)
    await settle(rt)
    assert body["status"]["ready"] == "2/2"
    written = len(kube.patches)
    engine = engines(platform.endpoint_of("job-cell-0", 0))

    def live_failures() -> Any:
        snap = rt.metrics.job_gauges.jobs[("ns", "job")]
        return {cell[0]: v for name, cell, v in job_samples(snap, clock.now())
                if name == "rljob_cell_consecutive_probe_failures"}

    engine.healthy = False
    for failures in (1, 2):  # below the threshold of 3
        await clock.advance(1)
        await rt.run_pass()
        assert live_failures()["job-cell-0"] == failures
    assert len(kube.patches) == written, "a failure below the threshold is not written"
    assert not body["status"]["engines"][0].get("consecutiveFailures")
    engine.healthy = True  # one success resets it: still nothing to write
    await clock.advance(1)
    await rt.run_pass()
    assert live_failures()["job-cell-0"] == 0 and len(kube.patches) == written
    engine.healthy = False
    for _ in range(3):  # the threshold: Unhealthy, written with its count
        await clock.advance(1)
        await rt.run_pass()
    assert len(kube.patches) > written
    cell = body["status"]["engines"][0]
    assert cell["name"] == "job-cell-0" and cell["consecutiveFailures"] == 3, cell


async def test_a_pending_cells_pods_are_written_with_its_start_or_once_it_waits_long():
    """Pod names and the endpoint of a Pending cell come in a pass or two before it starts; written
    each on its own they were 37-46 % of an N=300 ramp's status patches (issue 13). They go out
    with the cell's start, or on their own once the cell has been Pending for
    PENDING_QUIET_SECONDS (stuck: `kubectl describe` names its pods)."""
    from rljob_operator.reconcile.job_status import PENDING_QUIET_SECONDS

    clock, platform, body = FakeClock(), FakePlatform(start_running=False), rljob(replicas=1)
    rt, kube, _ = runtime(body, platform, clock)
    await settle(rt, passes=2)
    cell = body["status"]["engines"][0]
    assert cell["state"] == "Pending" and not cell.get("pods"), cell  # made, not yet written
    written = len(kube.patches)
    await clock.advance(1)
    await settle(rt, passes=2)
    assert len(kube.patches) == written and rt.controller.fleet.get("job-cell-0").pods  # known, not written
    platform.run_pods("job-cell-0")
    await settle(rt, passes=2)
    cell = body["status"]["engines"][0]
    assert cell["state"] != "Pending" and cell["pods"] == ["job-cell-0-g0-0"] and cell["endpoint"], cell

    stuck_platform, stuck = FakePlatform(start_running=False), rljob(replicas=1)
    rt2, _kube2, _ = runtime(stuck, stuck_platform, clock)
    await settle(rt2, passes=2)
    assert not stuck["status"]["engines"][0].get("pods")
    await clock.advance(PENDING_QUIET_SECONDS)
    await settle(rt2, passes=1)
    assert stuck["status"]["engines"][0]["pods"] == ["job-cell-0-g0-0"], "a cell Pending that long names its pods"


async def test_a_starting_jobs_cells_that_come_up_apart_are_written_in_one_status_write():
    """In an N=1,000 ramp a third of the RLJob status writes told that some cells of a job came up
    while the others still started, and 943 of 982 were followed by the job's all-serving write
    within 2 s (issue 13). A pass holds such news up to STARTUP_HOLD_SECONDS for the rest."""
    from rljob_operator.reconcile.job_status import STARTUP_HOLD_SECONDS

    clock, platform, body = FakeClock(), FakePlatform(start_running=False), rljob()
    rt, kube, _ = runtime(body, platform, clock)
    await settle(rt, passes=2)
    written = len(kube.patches)
    platform.run_pods("job-cell-0")
    delay = await rt.run_pass()
    assert rt.controller.fleet.get("job-cell-0").state.name == "Serving"
    assert len(kube.patches) == written, "one cell up while the other starts: held"
    assert delay <= STARTUP_HOLD_SECONDS, "the pass comes back when the hold is due"
    await clock.advance(STARTUP_HOLD_SECONDS / 4)
    platform.run_pods("job-cell-1")
    await settle(rt, passes=2)
    assert len(kube.patches) == written + 1, kube.patches[written:]
    assert body["status"]["ready"] == "2/2" and find(body["status"]["conditions"], "Ready")["status"] == "True"


async def test_held_start_up_progress_is_written_when_due_and_a_controller_calls_write_is_never_held():
    from rljob_operator.reconcile.job_status import STARTUP_HOLD_SECONDS

    clock, platform, body = FakeClock(), FakePlatform(start_running=False), rljob()
    rt, kube, _ = runtime(body, platform, clock)
    await settle(rt, passes=2)
    written = len(kube.patches)
    platform.run_pods("job-cell-0")  # job-cell-1 stays Pending (unschedulable, say)
    await rt.run_pass()
    assert len(kube.patches) == written
    await clock.advance(STARTUP_HOLD_SECONDS)
    await rt.run_pass()
    assert len(kube.patches) == written + 1 and body["status"]["ready"] == "1/2", "written once due"

    clock2, platform2, body2 = FakeClock(), FakePlatform(start_running=False), rljob()
    rt2, kube2, _ = runtime(body2, platform2, clock2)
    await settle(rt2, passes=2)
    written = len(kube2.patches)
    platform2.run_pods("job-cell-0")
    await rt2.run_pass()
    assert len(kube2.patches) == written
    await rt2.publish("cells")  # a controller call records its effect before it answers
    assert len(kube2.patches) == written + 1 and body2["status"]["ready"] == "1/2"


async def test_the_children_resync_reads_and_writes_only_what_drifted():
    """Re-applying every child on the resync timer is a write per child whether or not anything
    changed (issue 13: 200 writes/s at 1,000 jobs). The resync reads them and applies only a
    missing or changed one."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, applied = runtime(body, platform, clock)
    await settle(rt)
    first = len(applied)
    await clock.advance(120)  # past the children's resync
    await settle(rt, passes=2)
    assert len(applied) == first and "Service/job-engines" in kube.reads  # read, nothing written
    del kube.stored["Service/job-engines"]  # someone deleted a Service
    kube.stored["Deployment/job-rollout"]["spec"]["replicas"] = 0  # and scaled the executor down
    await clock.advance(120)
    await settle(rt, passes=2)
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in applied[first:]) == [
        "Deployment/job-rollout",
        "Service/job-engines",
    ]


async def test_the_resync_reads_only_the_children_whose_watched_version_moved():
    """At rest the drift check read every child every 30 s: ~100 GETs/s at 1,000 jobs, where
    KubeRay's operator reads its children from informer caches (issue 13). With the children's
    versions watched, a child still at the version its apply answered is not read; one the watch
    saw change, or deleted, is read (and repaired); every child is read once its last
    verification is `MAX_AGE_SECONDS` old."""
    from rljob_operator.reconcile.context import CHILDREN_RESYNC_SECONDS

    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    seen = ChildVersions((kind for _, kind in WATCHED_KINDS), MAX_AGE_SECONDS)
    rt, kube, applied = runtime(body, platform, clock, children=seen)
    await settle(rt)
    for stored in kube.stored.values():  # what the watch delivers of the applies
        seen.record(stored["kind"], "ADDED", stored)
    kube.reads.clear()
    await clock.advance(CHILDREN_RESYNC_SECONDS + 1)
    await settle(rt, passes=2)
    assert kube.reads == [], "every child at the version its apply answered: nothing read"

    edited = kube.stored["Service/job-engines"]
    edited["spec"]["ports"] = []  # a hand edit: a new version, seen by the watch
    edited["metadata"]["resourceVersion"] = "edited"
    seen.record("Service", "MODIFIED", edited)
    gone = kube.stored.pop("NetworkPolicy/job-engine-ingress")
    seen.record("NetworkPolicy", "DELETED", gone)
    first = len(applied)
    await clock.advance(CHILDREN_RESYNC_SECONDS + 1)
    await settle(rt, passes=2)
    assert sorted(kube.reads) == ["NetworkPolicy/job-engine-ingress", "Service/job-engines"]
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in applied[first:]) == sorted(kube.reads)

    for stored in kube.stored.values():
        seen.record(stored["kind"], "MODIFIED", stored)
    kube.reads.clear()
    await clock.advance(MAX_AGE_SECONDS)
    await settle(rt, passes=2)
    assert "Service/job-cells" in kube.reads, "an old verification is read again"


async def test_the_drift_check_waits_while_other_work_is_queued_but_not_past_its_bound():
    """Queued behind a 1,000-job ramp's work, a resync's drift reads waited 72 s on average with
    the job's loop blocked in them (no edit, no replacement acted on meanwhile). The check is put
    off while work is queued, and queued anyway once `CHILDREN_RESYNC_OVERDUE_SECONDS` late."""
    from rljob_operator.reconcile.children import CHILDREN_RESYNC_OVERDUE_SECONDS
    from rljob_operator.reconcile.context import CHILDREN_RESYNC_SECONDS

    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, kube, _ = runtime(body, platform, clock)
    await settle(rt)
    kube.reads.clear()
    kube.work_waiting = True
    await clock.advance(CHILDREN_RESYNC_SECONDS + 1)
    await settle(rt, passes=2)
    assert kube.reads == [], "the check waits for the pool's work"
    await clock.advance(CHILDREN_RESYNC_OVERDUE_SECONDS)
    await settle(rt, passes=1)
    assert "Service/job-engines" in kube.reads, "an overdue check is made anyway"
    kube.reads.clear()
    kube.work_waiting = False
    await clock.advance(CHILDREN_RESYNC_SECONDS + 1)
    await settle(rt, passes=1)
    assert "Service/job-engines" in kube.reads, "a free pool: checked when due"


async def test_only_a_change_besides_the_status_wakes_the_loop():
    """The operator's own status write comes back as a watch event; waking for it ran one more
    full pass per write (issue 13). A spec edit, a label or the deletion mark still wakes."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    await settle(rt)
    event = copy.deepcopy(body)
    event["status"] = {**event["status"], "ready": "1/2"}
    rt._wake.clear()
    rt.poke_for(event)
    assert not rt._wake.is_set()
    for change in ({"generation": 2}, {"labels": {"kueue.x-k8s.io/queue-name": "q"}},
                   {"deletionTimestamp": "2026-12-01T10:00:00Z"}):  # fmt: skip
        rt.poke_for({**event, "metadata": {**event["metadata"], **change}})
        assert rt._wake.is_set(), change
        rt._wake.clear()


async def woken_by_pod(rt: JobRuntime, pod: dict[str, Any]) -> bool:
    """Whether a pod event wakes the loop (after the coalescing delay, waited for on the event)."""
    rt.poke_for_pod(pod)
    if rt._pod_wake is None:
        return rt._wake.is_set()
    await asyncio.wait_for(rt._wake.wait(), 5)
    return True


async def test_an_engine_pod_event_wakes_the_loop_only_when_a_cell_waits_for_pods_or_a_pod_fails():
    """Pods were seen running only at the next poll (1 RLJob Ready in 3.9 s vs 0.4 s for KubeRay's
    RayCluster, issue 13); the pod watch wakes the loop, but not for a healthy fleet's pods (our
    own serving-label patches)."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    running = {"metadata": {"name": "job-cell-0-g0-0"}, "status": {"phase": "Running"}}
    assert await woken_by_pod(rt, running)  # no controller yet: the first pass waits for everything
    await settle(rt)
    assert body["status"]["ready"] == "2/2"
    rt._wake.clear()
    assert not await woken_by_pod(rt, running)
    for pod in ({**running, "status": {"phase": "Failed"}},
                {"metadata": {**running["metadata"], "deletionTimestamp": "2026-12-01T10:00:00Z"}, "status": {"phase": "Running"}}):  # fmt: skip
        assert await woken_by_pod(rt, pod), pod
        rt._wake.clear()
    body["spec"]["inference"]["replicas"] = 3
    body["metadata"]["generation"] = 2
    await rt.run_pass()  # a new cell, Pending: its pods are news
    assert await woken_by_pod(rt, running)


async def test_a_burst_of_pod_events_wakes_the_loop_once():
    """Each pod event used to wake the loop at once: a pass per event of a cell's burst, and a
    status write for each cell that moved (5.5 status writes per RLJob against 3.6, N=300)."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    pokes: list[bool] = []
    rt.poke = lambda: (pokes.append(True), JobRuntime.poke(rt))  # type: ignore[method-assign]
    for i in range(8):
        rt.poke_for_pod({"metadata": {"name": f"job-cell-{i // 2}-g0-{i % 2}"}, "status": {"phase": "Running"}})
    assert not rt._wake.is_set()  # not yet: the burst's other events may come
    await asyncio.wait_for(rt._wake.wait(), 5)
    assert pokes == [True]
    rt.poke_for_pod({"metadata": {"name": "job-cell-0-g0-0"}, "status": {"phase": "Running"}})
    assert rt._pod_wake is not None  # a later event: a wake of its own
    rt._pod_wake.cancel()



async def test_a_job_whose_cells_wait_for_their_pods_is_not_polled_its_pod_events_wake_it():
    """A Pending or Starting cell was looked at again every 0.5 s (STARTING_PROBE_SECONDS) though
    the pod watch wakes its job: at 1,000 RLJobs whose pods wait minutes in the API server's and
    the scheduler's queues, up to 2,000 passes a second asked of the one event loop. The pass's
    delay is now the resync's; the pods' running is seen through the watch's wake, and a starting
    engine's probes run from the loop's wait, the one that finds it up waking a pass."""
    clock, platform, engines, body = FakeClock(), FakePlatform(start_running=False), FakeEngines(), rljob()
    rt, _, _ = runtime(body, platform, clock, engines=engines)
    await rt.run_pass()  # the pods are made, and wait to be scheduled
    ctl = rt.controller
    assert ctl is not None and {c.state.name for c in ctl.fleet.all()} == {"Pending"}
    assert await rt.run_pass() == rt.resync_seconds, "no pass every 0.5 s while the pods wait"
    for name in list(platform.cells):
        engines(platform.endpoint_of(name, 0)).healthy = False  # loading
        platform.run_pods(name)
    assert await woken_by_pod(rt, {"metadata": {"name": "job-cell-0-g0-0"}, "status": {"phase": "Running"}})
    assert await rt.run_pass() == rt.resync_seconds, "no pass every 0.5 s while the engines load"
    assert {c.state.name for c in ctl.fleet.all()} == {"Starting"}
    rt._wake.clear()
    for engine in engines.engines.values():
        engine.healthy = True
    await clock.advance(STARTING_PROBE_SECONDS)  # a starting cell's re-probe is due: it runs on its own
    assert {c.state.name for c in ctl.fleet.all()} == {"Serving"}
    assert rt._wake.is_set(), "the probe that found the engines up woke a pass"
    await rt.run_pass()
    assert body["status"]["ready"] == "2/2"

class EventPool:
    """A sink of its own for Events (the operator gives them a pool apart from the passes' calls)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def create_event(self, involved, type_, reason, message, now, action="Reconcile") -> None:
        self.events.append(reason)


async def test_events_go_to_their_own_sink_never_through_the_passes_api_pool():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    kube = FakeKube(body)
    kube.platform = platform
    pool = EventPool()
    rt = JobRuntime(body=body, kube=kube, platform=platform, registry=JobRegistry(), metrics=Metrics(),
                    controller_url="http://op:8080", resync_seconds=5, clock=clock, engines=FakeEngines(),
                    events=pool)  # fmt: skip
    rt.recorder.start()
    await settle(rt)
    assert {"CellServing", "AllEnginesServing"} <= set(pool.events)
    assert kube.events == []
    await rt.recorder.close()


async def test_the_relists_copy_is_dropped_once_kopfs_view_caught_up():
    """A listed body newer than kopf's is acted on; once kopf's watch brings that generation the
    runtime keeps no second whole RLJob (it was kept for the runtime's life)."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    rt, _, _ = runtime(body, platform, clock)
    await settle(rt)
    listed = copy.deepcopy(body)
    listed["metadata"]["generation"] = 2
    listed["spec"]["inference"]["replicas"] = 3
    rt.observe_listed(listed)
    await settle(rt)
    assert rt.body is listed and len(rt.controller.fleet.cells) == 3
    body["metadata"]["generation"] = 2  # kopf's watch delivers the edit
    body["spec"]["inference"]["replicas"] = 3
    await rt.run_pass()
    assert rt._listed is None and rt.body is body and len(rt.controller.fleet.cells) == 3


class _NotStopped:
    """kopf's `stopped` flag of a daemon that nobody stops."""

    def __bool__(self) -> bool:
        return False

    async def wait(self) -> None:
        await asyncio.Event().wait()


async def test_probes_that_fall_due_between_passes_start_without_a_pass():
    """A job's probes used to be started by passes: the controller asked for a pass whenever a
    cell's probe fell due, up to one whole pass per cell per interval (158 passes/s at 1,000 jobs
    where the resync asks for 100, and the event loop too busy for a changed job or the Lease).
    Now a pass's delay is the resync's, and the loop starts the due probes while it waits."""
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    engines = FakeEngines()
    kube = FakeKube(body)
    kube.platform = platform
    rt = JobRuntime(body=body, kube=kube, platform=platform, registry=JobRegistry(), metrics=Metrics(),
                    controller_url="http://op:8080", resync_seconds=5, clock=clock, engines=engines)
    await settle(rt)
    ctl = rt.controller
    assert ctl is not None and all(c.state.name == "Serving" for c in ctl.fleet.all())
    interval = ctl.spec.health_check.interval_seconds
    assert await rt.run_pass() > interval, "a pass does not wake for the next probe"

    def probes() -> int:
        return sum(e.health_started for e in engines.engines.values())

    def passes() -> float:
        return sum(s.value for m in rt.metrics.reconciles.collect() for s in m.samples if s.name.endswith("_total"))

    before, passes_before = probes(), passes()
    await clock.advance(interval)
    assert ctl.seconds_until_probe() == 0
    rt._wake.clear()  # what the settling passes' own cell events asked for (the loop's sleep clears it)
    await rt.wait(0.2, _NotStopped())
    assert probes() - before == len(ctl.fleet.all()), "every due probe started while the loop waited"
    assert passes() == passes_before, "and no pass ran for them"
    due = ctl.seconds_until_probe()
    assert due is not None and due > 0, "nothing due again until the next interval (no busy loop)"


async def test_a_jobs_events_wait_while_its_status_write_is_out():
    """An Event queued before a status write goes out after it: the API server is not asked
    for both at once (a controller verb answers only after its write; bench/RESULTS.md)."""
    clock = FakeClock()
    rt, kube, _ = runtime(rljob(), FakePlatform(), clock)
    rt.recorder.start()
    gate = asyncio.Event()
    patch = kube.patch_rljob_status
    order: list[str] = []

    async def slow_patch(ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        order.append("patch sent")
        await gate.wait()
        order.append("patch answered")
        return await patch(ns, name, status)

    create_event = kube.create_event

    async def event(*args: Any, **kwargs: Any) -> None:
        order.append("event")
        await create_event(*args, **kwargs)

    kube.patch_rljob_status = slow_patch
    kube.create_event = event

    async def verb() -> None:  # as a controller verb: its Event queued, then its write, no yield between
        rt.recorder.record("Normal", "WindowOpened", "trainer opened an update window")
        await rt.publish("start_update_weights")

    write = asyncio.create_task(verb())
    for _ in range(20):  # every chance for the recorder's task to write while the patch is out
        await asyncio.sleep(0)
    assert order == ["patch sent"]
    gate.set()
    await write
    await rt.recorder.flush()
    assert order == ["patch sent", "patch answered", "event"]
    await rt.recorder.close()


async def test_the_operators_peers_reach_the_applied_network_policies():
    """The chart's operator namespace and scraper (the operator's settings) are in what is applied."""
    body = rljob()
    kube = FakeKube(body)
    kube.platform = FakePlatform()
    rt = JobRuntime(body=body, kube=kube, platform=kube.platform, registry=JobRegistry(), metrics=Metrics(),
                    controller_url="http://op:8080", resync_seconds=5, clock=FakeClock(), engines=FakeEngines(),
                    peers=PolicyPeers("ops", "monitoring"))
    await rt.run_pass()
    namespaces = {peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for o in kube.applied if o["kind"] == "NetworkPolicy"
                  for rule in o["spec"]["ingress"] for peer in rule["from"] if "namespaceSelector" in peer}
    assert namespaces == {"ops", "monitoring"}
