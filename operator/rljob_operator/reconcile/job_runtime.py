"""The per-job daemon: one RLJob on the leading replica, pass after pass.

`JobRuntime` is what kopf's daemon runs for one RLJob while this replica leads. Each pass
first asks Kueue (`queueing`, for jobs with a queue-name label), then runs the steps in order
(lifecycle, children, suspension, engines) on the spec Kueue's decision makes of the user's
(`queueing.admitted_spec`: suspended until admitted, then placed on the flavors); each step takes the
objects it works on and returns what it saw, and the pass hands those values to the status
writer. What a pass saw also stays for the controller API's writes between passes (they
record the controller's state; the trainer's outcome and the engine pods left are the last
pass's). The steps know nothing of this class, so it sits above them all.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from pydantic import ValidationError

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.clock import Clock, RealClock
from controller_runtime.controller import InferenceController
from controller_runtime.events import Reason
from controller_runtime.ports import EngineClientFactory, Platform
from rljob_operator.child_versions import ChildVersions
from rljob_operator.conditions import Want
from rljob_operator.event_recorder import EventRecorder, EventSink
from rljob_operator.kube.api_pool import in_pass
from rljob_operator.manifests import PolicyPeers
from rljob_operator.metrics import Metrics
from rljob_operator.pod_cache import object_version
from rljob_operator.reconcile import children, lifecycle, queueing
from rljob_operator.reconcile.context import CHILDREN_RESYNC_SECONDS, JobContext, JobKube, involved_object
from rljob_operator.reconcile.delete import release_job
from rljob_operator.reconcile.engines import WAITS_ON_PODS, EngineFleet, ensure_engines, wants_a_pass
from rljob_operator.reconcile.flow import Step, StepResult, run_steps
from rljob_operator.reconcile.job_status import Observed, TrainerState
from rljob_operator.reconcile.status_writer import StatusWriter
from rljob_operator.registry import JobRegistry
from rljob_operator.workload_cache import WorkloadCache

log = logging.getLogger(__name__)

MIN_PASS_SECONDS = 0.2
# A pod event wakes its job this long after it comes, with the events that come meanwhile: one
# pass for a burst (a cell's pods scheduled, running, ready within milliseconds of each other).
POD_WAKE_SECONDS = 0.1
# How long a converging job's passes keep the queue rank of the pass that began its work (`queue_rank`).
CONVERGING_RANK_SECONDS = 1800.0
ERROR_BACKOFF_MAX = 30.0


@dataclass(frozen=True)
class Seen:
    """What the passes saw around the controller, as the status writer needs it."""

    trainer: TrainerState = TrainerState.absent
    trainer_message: str = ""
    trainer_reason: str = ""
    trainer_restarts: int = 0
    engine_pods_left: int = 0
    trainer_workload: Want | None = None


def pod_wakes_job(pod: Mapping[str, Any], job_waits_on_pods: bool) -> bool:
    """Whether an engine pod's watch event is news for its job's loop.

    Without it a cell waits for its pods by polling and sees them run up to a poll late. Not news:
    events of a job none of whose cells waits for pods, unless the pod failed or is going away
    (what makes a Serving cell Unhealthy); so our own label patches of serving pods wake nothing.
    """
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return job_waits_on_pods or bool(meta.get("deletionTimestamp")) or phase in ("Failed", "Succeeded")


def wake_key(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of an RLJob a pass acts on besides its status: the spec (by its generation), the
    labels (Kueue's queue name) and the deletion mark.

    Every status write of ours comes back as a watch event, and waking for it would run one more
    full pass per write. An event whose key equals the one the last pass started from has
    nothing new for a pass.
    """
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (meta.get("generation"), tuple(sorted(labels.items())), meta.get("deletionTimestamp"))


class JobRuntime:
    """One RLJob on the leading replica: its engines, status writer and event recorder."""

    def __init__(
        self,
        *,
        body: Mapping[str, Any],
        kube: JobKube,
        platform: Platform,
        registry: JobRegistry,
        metrics: Metrics,
        controller_url: str,
        resync_seconds: float = 10.0,
        clock: Clock | None = None,
        engines: EngineClientFactory | None = None,
        acting: Callable[[], bool] = lambda: True,
        session: aiohttp.ClientSession | None = None,
        events: EventSink | None = None,
        child_versions: ChildVersions | None = None,
        children_resync_seconds: float = CHILDREN_RESYNC_SECONDS,
        peers: PolicyPeers | None = None,
        workloads: WorkloadCache | None = None,
    ) -> None:
        meta = body.get("metadata") or {}
        self.watched = body  # kopf's live view: spec/metadata change under us as the watch sees them
        self._listed: Mapping[str, Any] | None = None  # the RLJob as the operator's relist last saw it
        self._ended = False  # the relist found the RLJob gone while kopf missed its deletion
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.metrics = metrics
        self.controller_url = controller_url
        self.resync_seconds = resync_seconds
        self.acting = acting  # False on a replica that lost the Lease: no effects at all
        clock = clock or RealClock()
        uid = meta.get("uid", "")
        recorder = EventRecorder(events or kube, involved_object(self.namespace, self.name, uid), clock)
        self.job = JobContext(self.namespace, self.name, uid, kube, recorder, clock, resync_seconds,
                              child_versions, children_resync_seconds, peers or PolicyPeers(), workloads)  # fmt: skip
        self.fleet = EngineFleet(
            job=self.job, platform=platform, registry=registry, metrics=metrics, handle=self, wake=self.poke,
            engines=engines, generation=self.generation, session=session,
        )
        self.status = StatusWriter(self.job, metrics, body.get("status"))
        self.seen = Seen()
        self.queue = queueing.QueueSeen()  # Kueue's last decision (nothing for an unqueued job)
        self._applied: children.Applied | None = None
        self._wake = asyncio.Event()
        self._pod_wake: asyncio.TimerHandle | None = None  # a pod event's wake to come (`poke_for_pod`)
        self._woken = False  # something poked the loop since the last pass started (`resyncing`)
        self._errors = 0
        self._last_error = ""
        self._pass_key: tuple[Any, ...] | None = None  # wake_key of the body the last pass started from
        self._working_since: float | None = None  # queue rank of the work the passes continue (`queue_rank`)
        self._confirmed = False  # the RLJob was read afresh (`confirm_body`) before a pass acted on it
        self._pass_specs: PassSpecs | None = None  # the spec as the running pass reads it (`spec`)
        self._kept_spec: tuple[dict[str, Any], RLJobSpec] | None = None  # (a copy of the raw spec, validated)

    # ---------------------------------------------------------------- views
    @property
    def body(self) -> Mapping[str, Any]:
        """The newer of kopf's view and the operator's relist, by metadata.generation.

        kopf watches from the last resourceVersion it saw and re-lists only after a 410: a
        watch event lost on the way leaves its view old until the object changes again, a
        spec edit never acted on. The relist (`rljob_operator.relist`, one LIST for all jobs)
        makes that up; a generation never goes back, so neither view can undo a newer spec.
        """
        return newer_body(self.watched, self._listed)

    def observe_listed(self, body: Mapping[str, Any]) -> None:
        """The relist's copy of the RLJob; a newer spec than kopf's wakes the loop."""
        self._listed = body
        if _generation(body) > _generation(self.watched) and wake_key(body) != self._pass_key:
            self.poke()

    async def confirm_body(self) -> None:
        """Read the RLJob once, with a quorum GET, before the first pass acts on kopf's body.

        kopf's first body comes from its LIST at start-up. A LIST answered from a lagging cache
        hands a restarted operator a spec older than the one its cells serve, and a status older
        than the restart counts and weight version the controller is restored from; acted on,
        the old spec scales the fleet back down and the old status forgets restarts. kopf's watch
        then replays what it missed, but the first pass may run before it does. One GET per job
        start closes that gap (the periodic relist comes only after its period): the spec is the
        newer of the two by generation, the status the newer by resourceVersion.
        """
        fresh = await self.job.kube.get_rljob(self.namespace, self.name)
        self._confirmed = True
        if fresh is None or (self.job.uid and (fresh.get("metadata") or {}).get("uid") != self.job.uid):
            self.end()  # gone, or replaced by a namesake: kopf's deletion event ends us too
            return
        if object_version(fresh) > object_version(self.watched):
            self.status.stored = dict(fresh.get("status") or {})
        self.observe_listed(fresh)

    def end(self) -> None:
        """The RLJob is gone and kopf missed it: the loop ends (and releases the job)."""
        self._ended = True
        self.poke()

    @property
    def generation(self) -> int | None:
        g = (self.body.get("metadata") or {}).get("generation")
        return int(g) if g is not None else None

    def spec(self) -> RLJobSpec:
        """The spec as the user wrote it; validated once per pass, and once per spec.

        A pass reads it several times (its steps, the manifests, Kueue's Workload, the status it
        writes), and validation is dear enough to show in the event loop's busy time, so the
        pass acts on one snapshot (a spec edit during the pass wakes the next one). The validated
        spec is kept across passes with a copy of what it was validated from: comparing the two
        dicts is far cheaper than validating, and any edit, in place or a new body, makes them differ."""
        memo = self._pass_specs
        if memo is not None and memo.user is not None:
            return memo.user
        raw = self.body.get("spec") or {}
        kept = self._kept_spec
        if kept is not None and kept[0] == raw:
            spec = kept[1]
        else:
            spec = RLJobSpec.model_validate(raw)
            self._kept_spec = (copy.deepcopy(dict(raw)), spec)
        if memo is not None:
            memo.user = spec
        return spec

    def effective_spec(self) -> RLJobSpec:
        """The spec the steps run: the user's, suspended or placed as Kueue decided."""
        memo = self._pass_specs
        if memo is not None and memo.effective is not None and memo.queue is self.queue:
            return memo.effective
        effective = queueing.admitted_spec(self.spec(), self.queue)
        if memo is not None:
            memo.effective, memo.queue = effective, self.queue
        return effective

    def job_object(self) -> dict[str, Any]:
        """The RLJob as the manifest builders take it (with the effective spec)."""
        return {"metadata": dict(self.body.get("metadata") or {}), "spec": self.effective_spec()}

    @property
    def build_key(self) -> tuple[int | None, Any]:
        """What children and new cells are built from: the spec generation and Kueue's admission."""
        return (self.generation, self.queue.key)

    @property
    def recorder(self) -> EventRecorder:
        return self.job.recorder

    @property
    def stored_status(self) -> dict[str, Any]:
        return self.status.stored

    # ---------------------------------------------------------------- JobHandle
    @property
    def controller(self) -> InferenceController | None:
        return self.fleet.controller

    def poke(self) -> None:
        self._woken = True
        self._wake.set()

    def poke_for_pod(self, pod: Mapping[str, Any]) -> None:
        """Wake for an engine pod's watch event when a pass has something to do with it, in
        `POD_WAKE_SECONDS`, together with the events of the job's pods that come meanwhile.

        Woken at once for each event, a job would run a pass per pod event of a burst (its pods
        scheduled, then running, within milliseconds), each writing the status when a cell moved;
        batching the burst gives one pass and one write."""
        controller = self.fleet.controller
        waiting = controller is None or any(c.state in WAITS_ON_PODS for c in controller.fleet.all())
        if pod_wakes_job(pod, waiting) and self._pod_wake is None:
            self._pod_wake = asyncio.get_running_loop().call_later(POD_WAKE_SECONDS, self._pod_woken)

    def _pod_woken(self) -> None:
        self._pod_wake = None
        self.poke()

    def poke_for(self, body: Mapping[str, Any]) -> None:
        """Wake for a watch event of the RLJob unless it only carries a status (our own write)."""
        if wake_key(body) != self._pass_key:
            self.poke()

    def observed(self) -> Observed:
        """The status writer's input: the live spec and controller, and what the passes saw."""
        try:
            spec = self.effective_spec()
            suspend, replicas = spec.suspend, spec.inference.replicas
        except ValidationError:
            suspend, replicas = False, 0
        ctl = self.fleet.controller
        return Observed(
            now=self.job.clock.now(),
            generation=self.generation,
            suspend=suspend,
            replicas=replicas,
            controller=ctl.status_patch() if ctl else None,
            trainer=self.seen.trainer,
            trainer_message=self.seen.trainer_message,
            trainer_reason=self.seen.trainer_reason,
            trainer_restarts=self.seen.trainer_restarts,
            engine_pods_left=self.seen.engine_pods_left,
            queue=self.queue.state,
            trainer_workload=self.seen.trainer_workload,
        )

    async def publish(self, why: str, may_hold: bool = False) -> None:
        """Write what changed in the status (a merge patch), then Events for condition changes;
        the job's queued Events wait for the write (`EventRecorder.held`). `may_hold`: a pass's
        write, whose start-up progress may wait (`status_writer`); a controller call's never."""
        with self.recorder.held():
            await self.status.write(self.observed, why, may_hold)

    # ---------------------------------------------------------------- the loop
    def steps(self, spec: RLJobSpec) -> list[tuple[str, Step]]:
        """The pass's steps, in order; each folds what its step saw into `seen` as it returns."""

        async def finish() -> StepResult:
            return self._saw_pods(await lifecycle.ensure_finished(self.job, self.fleet, spec, self.stored_status))

        async def ensure_children() -> StepResult:
            seen = await children.ensure_children(
                self.job,
                spec,
                self.job_object(),
                self.build_key,
                self.controller_url,
                self._applied,
                queueing.unplaced_flavors(self.queue),
                int(self.stored_status.get("trainerRestarts") or 0),
            )
            self._applied = seen.applied
            self.seen = replace(
                self.seen,
                trainer=seen.trainer,
                trainer_message=seen.trainer_message,
                trainer_reason=seen.trainer_reason,
                trainer_restarts=seen.trainer_restarts,
                trainer_workload=seen.trainer_workload,
            )
            return seen.result

        async def suspend() -> StepResult:
            return self._saw_pods(await lifecycle.ensure_suspension(self.job, self.fleet, spec))

        async def engines() -> StepResult:
            return await ensure_engines(self.fleet, spec.inference, self.stored_status, self.job_object(), self.build_key)

        return [("finish", finish), ("children", ensure_children), ("suspend", suspend), ("engines", engines)]

    def stopped(self) -> bool:
        """No pod of ours holds resources: no controller, no engine pod, our trainer not running
        (a workloadRef trainer is not ours: Kueue admits it apart)."""
        ours = self.seen.trainer_workload is None
        return (
            self.fleet.controller is None
            and self.seen.engine_pods_left == 0
            and not (ours and self.seen.trainer is TrainerState.running)
        )

    async def ask_kueue(self) -> None:
        """Kueue's decision for this pass (the Workload made to exist and match the spec)."""
        self.queue = await queueing.ensure_workload(
            self.job, {"metadata": dict(self.body.get("metadata") or {}), "spec": self.spec()},
            self.controller_url, self.stored_status, self.stopped(),
        )

    def _saw_pods(self, winding: lifecycle.EnginesWinding) -> StepResult:
        if winding.engine_pods_left is not None:
            self.seen = replace(self.seen, engine_pods_left=winding.engine_pods_left)
        return winding.result

    async def run_pass(self) -> float:
        """One reconcile pass and status write; seconds until the next pass."""
        if not self.acting():
            return self.resync_seconds
        started = time.perf_counter()
        rank = self.queue_rank(started)
        resync = self.resyncing()
        self._woken = False
        # Every Kubernetes call of this pass (its sub-tasks' too) queues by `rank`: ahead of later
        # work's, so that a busy pool finishes the jobs it began, and a resync's behind all work
        # (`api_pool`).
        with in_pass(rank, resync=resync):
            delay = await self._run_pass(started)
        self._working_since = rank if self.converging() else None
        return delay

    def resyncing(self) -> bool:
        """Whether the pass about to start only checks a job at rest: nothing woke it (no edit, no
        pod or probe news), the last pass acted on the same spec and labels and did not fail, and
        no cell waits for anything. Its Kubernetes calls queue behind every other pass's."""
        return (
            not self._woken
            and self._confirmed
            and self._errors == 0
            and self._working_since is None
            and wake_key(self.body) == self._pass_key
            and not self.converging()
        )

    def queue_rank(self, started: float) -> float:
        """When the work this pass continues began: the first pass since the job last had nothing
        to wait for, else this one (`started`).

        Ranking each pass by its own start is not enough: a job needs several passes to become
        ready (create its pods; see them run and label the cells Serving; write the status), and
        in a ramp the first passes of every job start together. Each job's second pass would then
        rank behind all the others' first passes, so no cell would be labelled Serving until nearly
        every pod of the fleet was created. A job that is converging keeps the rank it began with,
        so jobs finish in the order they started.
        A job converging for longer than `CONVERGING_RANK_SECONDS` (an engine that never comes
        up) queues as a new pass again: it cannot hold the front of the queue for good."""
        since = self._working_since
        if since is None or started - since > CONVERGING_RANK_SECONDS:
            return started
        return since

    def converging(self) -> bool:
        """Whether the job has work a coming pass continues: a cell waits for its pods (or the
        fleet is beyond its replicas), or a pass failed before the controller was built."""
        ctl = self.fleet.controller
        if ctl is None:
            return self._errors > 0
        return wants_a_pass(ctl)

    def _forget_caught_up_listing(self) -> None:
        """Drop the relist's copy once kopf's view is as new (by generation): `body` never picks it
        again (a generation never goes back), and it is a whole RLJob, status and managedFields
        included, which would otherwise be kept for the runtime's life after one lost event."""
        if self._listed is not None and _generation(self._listed) <= _generation(self.watched):
            self._listed = None

    async def _run_pass(self, started: float) -> float:
        self._forget_caught_up_listing()
        self._pass_key = wake_key(self.body)
        self._pass_specs = PassSpecs()
        step = "pass"
        try:
            if not self._confirmed:
                step = "read"
                await self.confirm_body()
                if self._ended:
                    return MIN_PASS_SECONDS
            step = "queue"
            await self.ask_kueue()
            step = "pass"
            step, result = await run_steps(self.steps(self.effective_spec()))
            step = "status"
            await self.publish(result.reason or "pass", may_hold=True)
            self._errors, self._last_error = 0, ""
            delay = result.after if result.after is not None else self.resync_seconds
            held = self.status.hold_left(self.job.clock.now())
            if held is not None:  # held start-up progress is written by the pass at its due time
                delay = min(delay, held)
        except Exception as e:
            self._errors += 1
            self.metrics.reconcile_errors.labels(self.namespace, self.name, step).inc()
            msg = f"{step}: {type(e).__name__}: {e}"
            log.exception("reconcile of %s failed in %s", self.job.key, step)
            if msg != self._last_error:
                self.recorder.record("Warning", Reason.ReconcileError, msg[:1000])
                self._last_error = msg
            delay = min(ERROR_BACKOFF_MAX, 0.5 * 2 ** min(self._errors, 6))
        finally:
            self._pass_specs = None
            self.metrics.reconciles.labels(self.namespace, self.name).inc()
            self.metrics.reconcile_seconds.labels(self.namespace, self.name).observe(time.perf_counter() - started)
        return max(MIN_PASS_SECONDS, min(delay, self.resync_seconds))

    async def run(self, stopped: Any) -> None:
        """Loop until kopf sets `stopped` (deletion, operator exit or lost leadership)."""
        self.recorder.start()
        try:
            while not stopped and not self._ended:
                delay = await self.run_pass()
                await self.wait(delay, stopped)
        finally:
            if self._pod_wake is not None:
                self._pod_wake.cancel()
            await release_job(self.job, self.fleet, self.metrics)

    async def wait(self, seconds: float, stopped: Any) -> None:
        """Until the next pass is due (or something wakes the loop), starting the engine probes
        that fall due meanwhile, without a pass.

        A probe falling due is not worth a pass: a job whose cells became Serving at different
        times would run a whole pass (the children step, Kueue, the status diff) per probe, and
        those passes crowd out the changed jobs and the Lease renewal on a large fleet. A probe's
        verdict that changes a cell still wakes a pass (`EngineFleet._on_controller_event`)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            ctl = self.fleet.controller
            due = ctl.seconds_until_probe() if ctl is not None and self.acting() else None
            if ctl is None or due is None or due >= left:
                await self._sleep(max(0.0, left), stopped)
                return
            if await self._sleep(due, stopped) or stopped or self._ended:
                return
            if ctl is not self.fleet.controller:
                continue  # released (suspended, deleted) or rebuilt while we slept
            # the probes' Kubernetes calls (a cell's serving label) queue as this job's work
            with in_pass(self.queue_rank(time.perf_counter())):
                await ctl.probe_health(wait=0)

    async def _sleep(self, seconds: float, stopped: Any) -> bool:
        """Whether the loop was woken (or stopped) before `seconds` passed."""
        async def stop_wait() -> None:
            await stopped.wait()

        wake = asyncio.ensure_future(self._wake.wait())
        stop = asyncio.ensure_future(stop_wait())
        try:
            done, _ = await asyncio.wait({wake, stop}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            stop.cancel()
        self._wake.clear()
        return bool(done)


@dataclass
class PassSpecs:
    """The spec as one pass reads it: the user's, and the effective one for Kueue's decision `queue`."""

    user: RLJobSpec | None = None
    effective: RLJobSpec | None = None
    queue: queueing.QueueSeen | None = None


def _generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)


def newer_body(watched: Mapping[str, Any], listed: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The body a job acts on: the listed one only when its generation is higher than kopf's
    view (equal: kopf's, which is as fresh or fresher for everything else)."""
    if listed is not None and _generation(listed) > _generation(watched):
        return listed
    return watched
