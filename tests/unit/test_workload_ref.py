"""A trainer the user runs (`spec.trainer.workloadRef`): the kind table, the outcome read from each
kind's conditions, and the RLJob's phase and TrainerWorkload condition that follow. Logic only:
tests/integration/test_operator_workload_ref.py reads real workloads from a real API server."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic import ValidationError
from rljob_operator.conditions import find
from rljob_operator.kube.connection import Response
from rljob_operator.kube.kubeapi import KubeApi, NotFound, names_object, resource_path
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.job_runtime import JobRuntime, Seen
from rljob_operator.reconcile.job_status import Observed, TrainerState, build_status
from rljob_operator.reconcile.workload_ref import (
    REASON_FAILED,
    REASON_MISSING,
    REASON_NOT_SERVED,
    missing,
    workload_outcome,
)
from rljob_operator.registry import JobRegistry
from rljob_operator.workload_cache import WorkloadCache

from controller_runtime.api.spec import WorkloadRef
from controller_runtime.api.workloads import (
    TRAINER_WORKLOADS,
    UNSUPPORTED_WORKLOAD_MSG,
    WorkloadKind,
    workload_kind,
)
from controller_runtime.clock import FakeClock
from controller_runtime.fakes import FakeEngines, FakePlatform
from tests.unit.test_job_runtime import FakeKube, rljob, runtime, settle

T0 = 1_800_000_000.0


def ref_of(row: WorkloadKind, name: str = "mine") -> WorkloadRef:
    return WorkloadRef.model_validate({"apiVersion": row.api_version, "kind": row.kind, "name": name})


def with_condition(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"status": {"conditions": [{"type": "Created", "status": "True"},
                                      {"type": type_, "status": status, "reason": reason, "message": message}]}}  # fmt: skip


def test_the_table_names_each_kind_by_its_controllers_condition_types():
    rows = {(w.api_version, w.kind): (w.succeeded, w.failed, w.suspended) for w in TRAINER_WORKLOADS}
    assert rows == {
        ("batch/v1", "Job"): ("Complete", "Failed", "Suspended"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"): ("Completed", "Failed", "Suspended"),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"): ("Complete", "Failed", "Suspended"),
        ("kubeflow.org/v1", "PyTorchJob"): ("Succeeded", "Failed", "Suspended"),
    }
    assert workload_kind("jobset.x-k8s.io/v1", "JobSet") is None  # a version is part of the key


@pytest.mark.parametrize("row", TRAINER_WORKLOADS, ids=lambda w: w.kind)
def test_each_kind_is_read_at_its_rest_path(row: WorkloadKind):
    """The API path the operator reads is the resource its RBAC grants (`row.plural`)."""
    path = resource_path(row.api_version, row.kind, "ns", "mine")
    assert path == f"/apis/{row.api_version}/namespaces/ns/{row.plural}/mine"


@pytest.mark.parametrize("row", TRAINER_WORKLOADS, ids=lambda w: w.kind)
def test_each_kinds_conditions_map_to_the_trainers_outcome(row: WorkloadKind):
    ref = ref_of(row)
    seen = workload_outcome(row, ref, with_condition(row.succeeded, message="all ranks exited 0"))
    assert seen.state is TrainerState.succeeded and seen.condition.reason == "Succeeded"
    seen = workload_outcome(row, ref, with_condition(row.failed, reason="BackoffLimitExceeded", message="rank 1 exited 3"))
    assert seen.state is TrainerState.failed and seen.reason == REASON_FAILED
    assert seen.message == f"{row.api_version} {row.kind} mine failed: BackoffLimitExceeded rank 1 exited 3"
    seen = workload_outcome(row, ref, with_condition(row.suspended))
    assert seen.state is TrainerState.suspended and "Kueue" in seen.condition.message
    seen = workload_outcome(row, ref, with_condition(row.failed, status="False"))
    assert seen.state is TrainerState.running and "Kueue" in seen.condition.message
    assert workload_outcome(row, ref, {}).state is TrainerState.running  # no status yet


def test_another_kinds_condition_type_is_not_read_as_the_end():
    """JobSet says `Completed`, Job says `Complete`: each kind is read by its own row only."""
    jobset = workload_kind("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset is not None
    assert workload_outcome(jobset, ref_of(jobset), with_condition("Complete")).state is TrainerState.running


def test_a_ref_to_a_kind_the_operator_cannot_follow_is_refused_with_the_field_named():
    with pytest.raises(ValidationError) as err:
        WorkloadRef.model_validate({"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"})
    assert UNSUPPORTED_WORKLOAD_MSG in str(err.value)


def test_a_404_that_names_the_object_is_a_missing_object_else_a_kind_not_served():
    assert names_object('{"kind":"Status","reason":"NotFound","details":{"name":"mine","group":"batch","kind":"jobs"}}', "mine")
    assert not names_object('{"kind":"Status","reason":"NotFound","message":"the server could not find the requested resource","details":{}}', "mine")
    assert not names_object("404 page not found", "mine")


def test_a_failed_workload_fails_the_job_with_its_message_and_a_complete_one_succeeds_it():
    row = TRAINER_WORKLOADS[0]
    failed = workload_outcome(row, ref_of(row), with_condition(row.failed, reason="BackoffLimitExceeded", message="x"))
    s, _ = build_status({}, Observed(now=T0, replicas=1, trainer=failed.state, trainer_message=failed.message,
                                     trainer_reason=failed.reason, trainer_workload=failed.condition))  # fmt: skip
    assert s["phase"] == "Failed"
    assert (find(s["conditions"], "Failed") or {})["message"] == "batch/v1 Job mine failed: BackoffLimitExceeded x"
    assert (find(s["conditions"], "TrainerWorkload") or {})["reason"] == "Failed"
    done = workload_outcome(row, ref_of(row), with_condition(row.succeeded))
    s, _ = build_status({}, Observed(now=T0, replicas=1, trainer=done.state, trainer_workload=done.condition))
    assert s["phase"] == "Succeeded"


def test_a_missing_workload_is_a_false_condition_naming_it_and_the_job_goes_on():
    seen = missing(ref_of(TRAINER_WORKLOADS[0], "typo"))
    s, changed = build_status({}, Observed(now=T0, replicas=1, trainer=seen.state, trainer_workload=seen.condition))
    c = find(s["conditions"], "TrainerWorkload") or {}
    assert (c["status"], c["reason"]) == ("False", REASON_MISSING)
    assert "batch/v1 Job typo does not exist" in c["message"]
    assert s["phase"] == "Pending" and "TrainerWorkload" in {x["type"] for x in changed}


def _workload_condition(rt: JobRuntime) -> dict:
    return find(rt.stored_status.get("conditions"), "TrainerWorkload") or {}


async def test_passes_follow_the_referenced_job_to_its_end_and_free_the_engines():
    clock, platform = FakeClock(), FakePlatform()
    rt, kube, _ = runtime(rljob(), platform, clock)
    rt.recorder.start()
    assert kube.workloads is not None
    kube.workloads.clear()
    await settle(rt)
    assert _workload_condition(rt)["reason"] == REASON_MISSING
    assert ("Warning", REASON_MISSING) in {(t, r) for t, r, _ in kube.events}
    kube.workloads["mine"] = {"status": {}}
    await settle(rt)
    assert _workload_condition(rt)["reason"] == "Running" and rt.stored_status["phase"] == "Running"
    kube.workloads["mine"] = with_condition("Complete", message="Reached expected number of succeeded pods")
    await settle(rt)
    assert rt.stored_status["phase"] == "Succeeded"
    assert platform.cells == {}, "a finished job's engines are deleted"
    await rt.recorder.close()


async def test_a_kind_the_api_server_does_not_serve_is_a_condition_not_a_crash():
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    body["spec"]["trainer"]["workloadRef"] = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "mine"}
    rt, kube, _ = runtime(body, platform, clock)
    kube.workloads = None
    await settle(rt)
    c = _workload_condition(rt)
    assert (c["status"], c["reason"]) == ("False", REASON_NOT_SERVED)
    assert "jobsets.jobset.x-k8s.io/v1alpha2" in c["message"]
    assert rt.stored_status["phase"] == "Running"


def test_a_running_referenced_workload_does_not_keep_kueues_admission_held():
    """Kueue's admission is cleared once no pod of ours holds resources: the user's workload is not ours."""
    rt, _, _ = runtime(rljob(), FakePlatform(), FakeClock())
    running = workload_outcome(TRAINER_WORKLOADS[0], ref_of(TRAINER_WORKLOADS[0]), {})
    rt.seen = Seen(trainer=running.state, trainer_workload=running.condition)
    assert rt.stopped()
    rt.seen = Seen(trainer=TrainerState.running)  # the operator's own trainer Job
    assert not rt.stopped()


JOB_KEY = "batch/v1 Job"


def job_obj(name: str, *conditions: dict, namespace: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "1", "managedFields": [{"x": 1}]},
            "spec": {"template": {}}, "status": {"conditions": list(conditions)}}  # fmt: skip


def test_the_cache_is_trusted_only_where_its_watch_listed_and_wakes_the_followers_of_a_change():
    cache = WorkloadCache()
    assert cache.lookup(JOB_KEY, "ns", "mine") == (False, None)  # not listed: the pass reads with a GET
    assert cache.resync(JOB_KEY, "ns", []) == set()
    assert cache.lookup(JOB_KEY, "ns", "mine") == (True, None)  # listed, absent: missing, no GET
    cache.follow(("ns", "rl"), (JOB_KEY, "ns", "mine"))
    assert cache.record(JOB_KEY, "ADDED", job_obj("other")) == set()
    assert cache.record(JOB_KEY, "MODIFIED", job_obj("mine", {"type": "Complete", "status": "True"})) == {("ns", "rl")}
    known, obj = cache.lookup(JOB_KEY, "ns", "mine")
    assert known and obj == {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}  # trimmed
    assert cache.lookup(JOB_KEY, "other-ns", "mine") == (False, None)
    assert cache.resync(JOB_KEY, "ns", [job_obj("other")]) == {("ns", "rl")}  # went in a watch gap
    assert cache.lookup(JOB_KEY, "ns", "mine") == (True, None)
    cache.distrust(JOB_KEY, "ns")
    assert cache.lookup(JOB_KEY, "ns", "mine") == (False, None)
    cache.forget(("ns", "rl"))
    assert cache.record(JOB_KEY, "ADDED", job_obj("mine")) == set()


def test_a_job_follows_only_its_current_reference():
    cache = WorkloadCache()
    cache.follow(("ns", "rl"), (JOB_KEY, "ns", "a"))
    cache.follow(("ns", "rl"), (JOB_KEY, "ns", "b"))  # a spec edit
    assert cache.record(JOB_KEY, "ADDED", job_obj("a")) == set()
    assert cache.record(JOB_KEY, "ADDED", job_obj("b")) == {("ns", "rl")}


async def test_a_watched_kind_is_read_from_the_cache_not_with_a_get_per_pass():
    cache = WorkloadCache()
    clock, platform, body = FakeClock(), FakePlatform(), rljob()
    kube = FakeKube(body)
    kube.platform = platform
    rt = JobRuntime(body=body, kube=kube, platform=platform, registry=JobRegistry(), metrics=Metrics(),
                    controller_url="http://op:8080", resync_seconds=5, clock=clock, engines=FakeEngines(),
                    workloads=cache)  # fmt: skip
    kube.workloads = None  # a GET would say the kind is not served
    cache.record(JOB_KEY, None, job_obj("mine"))  # a cluster-wide watch listed it, running
    cache.resync(JOB_KEY, None, [job_obj("mine")])
    await settle(rt)
    assert _workload_condition(rt)["reason"] == "Running"
    assert cache.record(JOB_KEY, "MODIFIED", job_obj("mine", {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"})) == {("ns", "job")}
    await settle(rt)
    assert rt.stored_status["phase"] == "Failed"
    assert (find(rt.stored_status["conditions"], "Failed") or {})["message"] == "batch/v1 Job mine failed: DeadlineExceeded"


def test_only_served_kinds_are_watched_and_each_event_wakes_the_jobs_that_follow_it():
    from rljob_operator.handlers import OperatorContext
    from rljob_operator.settings import load_settings
    from rljob_operator.workload_watch import served, workload_watches

    row = TRAINER_WORKLOADS[1]
    assert served({"resources": [{"name": "jobsets"}, {"name": "jobsets/status"}]}, row)
    assert not served(None, row) and not served({"resources": [{"name": "jobs"}]}, row)
    s = load_settings(["--namespace", "rl", "--kubeconfig", "/dev/null"])
    ctx = OperatorContext(settings=s, kube=cast(Any, None), registry=JobRegistry(), metrics=Metrics(),
                          is_leader=lambda: True, make_platform=cast(Any, None), controller_url="",
                          workloads=WorkloadCache())  # fmt: skip
    woken: list[str] = []
    ctx.runtimes[("rl", "a")] = cast(Any, type("Rt", (), {"poke": lambda self: woken.append("a")})())
    (watch,) = workload_watches(s, cast(Any, type("Kube", (), {})()), ctx, "rl", [row])
    assert (watch.path, watch.selector) == ("/apis/jobset.x-k8s.io/v1alpha2/namespaces/rl/jobsets", "")
    assert ctx.workloads is not None
    ctx.workloads.follow(("rl", "a"), (row.key, "rl", "js"))
    watch.on_listed("rl", [], 1)
    watch.on_event("MODIFIED", job_obj("js", namespace="rl"))
    assert woken == ["a"]
    watch.version = "7"
    watch._count_restart("error")  # a failed watch: not trusted, and it lists again
    assert ctx.workloads.lookup(row.key, "rl", "js") == (False, None) and watch.version is None


class Answers:
    """Stands in for `kubeconn.ApiConnection`: answers each GET with a fixed 404 body."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def request(self, method: str, path: str, query: Any = (), body: Any = None,
                headers: Any = None, timeout: Any = None) -> Response:  # fmt: skip
        return Response(404, "Not Found", self.body)

    def close(self) -> None:
        pass


async def test_a_missing_workload_reads_as_none_and_a_kind_not_served_raises():
    missing_object = b'{"kind":"Status","reason":"NotFound","details":{"name":"mine","group":"batch","kind":"jobs"},"code":404}'
    kube = KubeApi(cast(Any, Answers(missing_object)))
    try:
        assert await kube.get_workload("batch/v1", "Job", "ns", "mine") is None
    finally:
        kube.close()
    kube = KubeApi(cast(Any, Answers(b"404 page not found")))
    try:
        with pytest.raises(NotFound):
            await kube.get_workload("jobset.x-k8s.io/v1alpha2", "JobSet", "ns", "mine")
    finally:
        kube.close()
