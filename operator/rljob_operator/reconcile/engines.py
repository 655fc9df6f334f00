"""The engines step: the job's `InferenceController` on this replica, and one pass of it.

`EngineFleet` holds the controller while this replica runs the job. It is rebuilt from
`status` whenever it starts (operator restart, failover, resume), so nothing lives only in
memory: cells, generations, restart counts, the open update window's lock and snapshot all
come back from the RLJob. It registers the job with the controller API while it runs.

Health monitoring happens inside the controller (each `run_pass` observes pods: phase and
container restarts, then probes each due cell's engine at its pod IP). Here the engine
clients are wrapped to time `/health` probes for the latency histogram, and the controller's
events become Kubernetes Events and metrics.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import aiohttp
from pydantic import ValidationError

from controller_runtime.api.spec import Engine, InferenceSpec
from controller_runtime.api.status import CellState, RLJobStatus
from controller_runtime.clients.factory import make_engine_client
from controller_runtime.controller import InferenceController
from controller_runtime.events import ControllerEvent, Reason
from controller_runtime.ports import CellRole, EngineClient, EngineClientFactory, Platform
from rljob_operator.audit_stream import job_audit
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.flow import StepResult
from rljob_operator.registry import VERB_PUBLISHES, JobHandle, JobRegistry

log = logging.getLogger(__name__)


# Events only the controller API's verbs emit: the verb writes the status itself before it
# answers, so an early pass would only hold the fleet's mutex while the trainer's next call (the
# weight push's end, the onload after training) waits for it. Any other event emitted inside such
# a verb (`registry.VERB_PUBLISHES`: a closed window, cells back from offload) wakes the daemon only
# when a cell waits for what a pass does. Everything else wakes it: a probe's verdict is applied
# off the pass and only a pass writes it.
PUBLISHED_BY_THE_VERB = frozenset({Reason.WindowOpened, Reason.Offloaded, Reason.Onloaded, Reason.RolloutPrepared})

# Cells that wait for a pass: their pods to be created, to run, or to be replaced.
WAITS_ON_PODS = frozenset({CellState.Pending, CellState.Starting, CellState.Unhealthy})


def wants_a_pass(controller: InferenceController) -> bool:
    """Whether a pass has work now: a cell waits for its pods, or is beyond spec.replicas (a
    scale-down that an update window deferred)."""
    cells = controller.fleet.all()
    return any(c.state in WAITS_ON_PODS for c in cells) or bool(controller.fleet.surplus(CellRole.policy,
                                                                                        controller.spec.replicas))


class TimedEngineClient:
    """An EngineClient whose `/health` calls are timed into the probe latency histogram."""

    def __init__(self, inner: EngineClient, observe: Callable[[float], None]) -> None:
        self._inner = inner
        self._observe = observe
        self.endpoint = inner.endpoint

    async def health(self) -> None:
        started = time.perf_counter()
        try:
            await self._inner.health()
        finally:
            self._observe(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def engine_factory(
    engine: Engine | str, observe: Callable[[float], None], session: aiohttp.ClientSession | None = None
) -> EngineClientFactory:
    """Timed clients of `engine`; on `session` when given (the operator's one pool for every
    job's cells: one connector and its keep-alive connections, not one per cell)."""

    def make(endpoint: str) -> EngineClient:
        return TimedEngineClient(make_engine_client(engine, endpoint, session=session), observe)

    return make


class EngineFleet:
    """The job's controller and platform on this replica; None while suspended, finished or stopped."""

    def __init__(
        self,
        *,
        job: JobContext,
        platform: Platform,
        registry: JobRegistry,
        metrics: Metrics,
        handle: JobHandle,
        wake: Callable[[], None],
        engines: EngineClientFactory | None = None,
        generation: Hashable = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.job = job
        self.session = session
        self.platform = platform
        self.registry = registry
        self.metrics = metrics
        self.handle = handle  # what the controller API finds in the registry while we run
        self.wake = wake
        self._engines = engines
        self.controller: InferenceController | None = None
        self._inference_spec: InferenceSpec | None = None
        self._platform_generation = generation  # the spec generation (and admission) new cells are built from

    def _on_controller_event(self, event: ControllerEvent) -> None:
        if event.reason == Reason.CellReplaced:
            self.metrics.restarts.labels(self.job.namespace, self.job.name).inc()
        self.metrics.count_event(self.job.namespace, self.job.name, event)
        self.job.recorder.controller_event(event)
        if event.reason in PUBLISHED_BY_THE_VERB:
            return
        if VERB_PUBLISHES.get() and self.controller is not None and not wants_a_pass(self.controller):
            return
        self.wake()  # something changed: write status soon

    def follow_spec(self, job_object: Mapping[str, Any], generation: Hashable) -> None:
        """Cells created from now on are built from the edited spec (or a new Kueue admission)."""
        if self._platform_generation != generation:
            self.platform.update_job(job_object)
            self._platform_generation = generation

    def ensure(self, inference: InferenceSpec, stored_status: Mapping[str, Any]) -> InferenceController:
        """The running controller (fed spec edits), or a new one restored from `stored_status`."""
        if self.controller is None:
            try:
                restore = RLJobStatus.model_validate(stored_status) if stored_status else None
            except ValidationError as e:
                log.warning("status of %s does not parse; starting fresh: %s", self.job.key, e)
                restore = None
            engines = self._engines or engine_factory(
                inference.engine, self.metrics.probe_seconds.labels(self.job.namespace, self.job.name).observe,
                self.session,
            )
            self.controller = InferenceController(
                job=self.job.name,
                spec=inference,
                platform=self.platform,
                engines=engines,
                clock=self.job.clock,
                on_event=self._on_controller_event,
                restore=restore,
                serve_initial_weights=True,
                poll_seconds=self.job.resync_seconds,
                probes_wake_passes=False,  # the job's loop starts them between passes (`JobRuntime.wait`)
                pods_wake_passes=True,  # the pod watch wakes the job (`JobRuntime.poke_for_pod`)
                audit=job_audit(self.job.namespace, self.job.name),
            )
            self._inference_spec = inference
            self.metrics.set_max_restarts(self.job.namespace, self.job.name, inference.restart_policy.max_restarts)
            self.registry.add(self.handle)
            self.metrics.jobs.set(len(self.registry))
            log.info(
                "controller started",
                extra={"job": self.job.key, "restored_cells": len(restore.engines) if restore else 0,
                       "lock": bool(restore and restore.lock)},
            )
        elif inference != self._inference_spec:
            self.controller.update_spec(inference)
            self._inference_spec = inference
            self.metrics.set_max_restarts(self.job.namespace, self.job.name, inference.restart_policy.max_restarts)
        return self.controller

    async def stop(self) -> None:
        """Forget the in-memory controller (its state is in status); the API answers 503/404 meanwhile."""
        if self.controller is None:
            return
        ctl, self.controller = self.controller, None
        self.registry.remove(self.handle)
        self.metrics.jobs.set(len(self.registry))
        with contextlib.suppress(Exception):
            await ctl.close()


async def ensure_engines(
    fleet: EngineFleet,
    inference: InferenceSpec,
    stored_status: Mapping[str, Any],
    job_object: Mapping[str, Any],
    generation: Hashable,
) -> StepResult:
    """Run one bounded controller pass: observe cells, create/heal/scale them, probe the due ones.

    The controller's own `run_pass` (the one local mode drives too) bounds the pass, so a hung
    engine or a failing platform call costs one pass, not the daemon; what failed is raised
    here so that the job runtime reports it as it reports every failed step (a ReconcileError
    Event, the reconcile-errors metric, backoff) instead of publishing a status over it.
    """
    fleet.follow_spec(job_object, generation)
    ctl = fleet.ensure(inference, stored_status)
    report = await ctl.run_pass()
    if report.failures:
        raise EnginePassFailed("; ".join(report.failures))
    return StepResult.requeue(report.delay, "engines")


class EnginePassFailed(Exception):
    """The controller's pass over the engine cells failed (its log has the traceback)."""
