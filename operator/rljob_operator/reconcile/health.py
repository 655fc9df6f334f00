"""The per-job daemon: one `InferenceController` per RLJob, restored from `status`.

`JobRuntime` is what kopf's daemon runs for one RLJob while this replica leads. Each pass
runs the steps in order (lifecycle, children, suspension, engines), then writes the status
that changed. The controller is rebuilt from `status` whenever the runtime starts (operator
restart, failover, resume), so nothing lives only in memory: cells, generations, restart
counts, the open update window's lock and snapshot all come back from the RLJob.

Health monitoring happens inside the controller (`reconcile` observes pods: phase and
container restarts; `probe_health` probes each cell's engine at its pod IP). Here the engine
clients are wrapped to time `/health` probes for the latency histogram, and the controller's
events become Kubernetes Events and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import ValidationError

from controller_runtime.api.spec import Engine, InferenceSpec, RLJobSpec
from controller_runtime.api.status import RLJobStatus
from controller_runtime.clients.factory import make_engine_client
from controller_runtime.clock import Clock, RealClock
from controller_runtime.controller import InferenceController
from controller_runtime.events import ControllerEvent, Reason
from controller_runtime.ports import EngineClient, EngineClientFactory, Platform
from rljob_operator.events import EventRecorder
from rljob_operator.kubeapi import GROUP, KIND, VERSION, KubeApi
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.flow import StepResult, run_steps
from rljob_operator.reconcile.status import (
    Observed,
    TrainerState,
    build_status,
    status_delta,
)
from rljob_operator.registry import JobRegistry

log = logging.getLogger(__name__)

MIN_PASS_SECONDS = 0.2
ERROR_BACKOFF_MAX = 30.0


def _news(c: Mapping[str, Any]) -> bool:
    """Whether a condition's value is worth an Event even the first time it is set."""
    bad = {"EnginesHealthy": "False", "Failed": "True", "Suspended": "True", "Ready": "True"}
    return bad.get(c["type"]) == c["status"]


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


def engine_factory(engine: Engine | str, observe: Callable[[float], None]) -> EngineClientFactory:
    def make(endpoint: str) -> EngineClient:
        return TimedEngineClient(make_engine_client(engine, endpoint), observe)  # type: ignore[return-value]

    return make


class JobRuntime:
    """One RLJob on the leading replica: its controller, status writer and event recorder."""

    def __init__(
        self,
        *,
        body: Mapping[str, Any],
        kube: KubeApi,
        platform: Platform,
        apply: Callable[[dict[str, Any]], Awaitable[Any]],
        registry: JobRegistry,
        metrics: Metrics,
        controller_url: str,
        resync_seconds: float = 10.0,
        clock: Clock | None = None,
        engines: EngineClientFactory | None = None,
        acting: Callable[[], bool] = lambda: True,
    ) -> None:
        meta = body.get("metadata") or {}
        self.body = body  # kopf's live view: spec/metadata change under us as the watch sees them
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta.get("uid", "")
        self.kube = kube
        self.platform = platform
        self.apply = apply
        self.registry = registry
        self.metrics = metrics
        self.controller_url = controller_url
        self.resync_seconds = resync_seconds
        self.clock = clock or RealClock()
        self._engines = engines
        self.acting = acting  # False on a replica that lost the Lease: no effects at all
        self.controller: InferenceController | None = None
        self._inference_spec: InferenceSpec | None = None
        self.stored_status: dict[str, Any] = dict(body.get("status") or {})
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.name, "namespace": self.namespace, "uid": self.uid}
        self.recorder = EventRecorder(kube, involved, self.clock)
        self.trainer: tuple[TrainerState, str] = (TrainerState.absent, "")
        self.engine_pods_left = 0
        self.children_generation: int | None = None
        self.platform_generation: int | None = self.generation
        self.children_at = 0.0
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._errors = 0
        self._last_error = ""

    # ---------------------------------------------------------------- views of the live body
    @property
    def generation(self) -> int | None:
        g = (self.body.get("metadata") or {}).get("generation")
        return int(g) if g is not None else None

    def spec(self) -> RLJobSpec:
        return RLJobSpec.model_validate(self.body.get("spec") or {})

    def job_object(self) -> dict[str, Any]:
        """The RLJob as the manifest builders take it."""
        return {"metadata": dict(self.body.get("metadata") or {}), "spec": dict(self.body.get("spec") or {})}

    # ---------------------------------------------------------------- JobHandle
    def poke(self) -> None:
        self._wake.set()

    async def publish(self, why: str) -> None:
        """Write what changed in the status (a merge patch), then Events for condition changes."""
        async with self._write_lock:
            try:
                spec = self.spec()
                suspend, replicas = spec.suspend, spec.inference.replicas
            except ValidationError:
                suspend, replicas = False, 0
            obs = Observed(
                now=self.clock.now(),
                generation=self.generation,
                suspend=suspend,
                replicas=replicas,
                controller=self.controller.status_patch() if self.controller else None,
                trainer=self.trainer[0],
                trainer_message=self.trainer[1],
                engine_pods_left=self.engine_pods_left,
            )
            obs_before = self.stored_status.get("conditions")
            status, changed = build_status(self.stored_status, obs)
            delta = status_delta(self.stored_status, status)
            if not delta:
                return
            obj = await self.kube.patch_rljob_status(self.namespace, self.name, delta)
            self.stored_status = dict(obj.get("status") or status)
            if self.controller is not None:
                self.metrics.set_cells(self.namespace, self.name, [e.get("state", "") for e in status.get("engines") or []])
            before = {c.get("type") for c in (obs_before or [])}
            for c in changed:
                if c["type"] not in before and not _news(c):
                    continue  # a condition's first, unremarkable value is not an event
                warning = (c["type"] == "EnginesHealthy" and c["status"] == "False") or (c["type"] == "Failed" and c["status"] == "True")
                self.recorder.record(
                    "Warning" if warning else "Normal",
                    c.get("reason") or c["type"],
                    f"{c['type']}={c['status']}" + (f": {c['message']}" if c.get("message") else ""),
                )
            log.debug("status written (%s): %s", why, sorted(delta), extra={"job": f"{self.namespace}/{self.name}"})

    # ---------------------------------------------------------------- controller lifecycle
    def _on_controller_event(self, event: ControllerEvent) -> None:
        if event.reason == Reason.CellReplaced:
            self.metrics.restarts.labels(self.namespace, self.name).inc()
        self.recorder.controller_event(event)
        self.poke()  # something changed: write status soon

    def ensure_controller(self, inference: InferenceSpec) -> InferenceController:
        if self.controller is None:
            try:
                restore = RLJobStatus.model_validate(self.stored_status) if self.stored_status else None
            except ValidationError as e:
                log.warning("status of %s/%s does not parse; starting fresh: %s", self.namespace, self.name, e)
                restore = None
            engines = self._engines or engine_factory(
                inference.engine, self.metrics.probe_seconds.labels(self.namespace, self.name).observe
            )
            self.controller = InferenceController(
                job=self.name,
                spec=inference,
                platform=self.platform,
                engines=engines,
                clock=self.clock,
                on_event=self._on_controller_event,
                restore=restore,
                serve_initial_weights=True,
                poll_seconds=self.resync_seconds,
            )
            self._inference_spec = inference
            self.registry.add(self)
            self.metrics.jobs.set(len(self.registry))
            log.info(
                "controller started",
                extra={"job": f"{self.namespace}/{self.name}", "restored_cells": len(restore.engines) if restore else 0,
                       "lock": bool(restore and restore.lock)},
            )
        elif inference != self._inference_spec:
            self.controller.update_spec(inference)
            self._inference_spec = inference
        return self.controller

    async def stop_controller(self) -> None:
        """Forget the in-memory controller (its state is in status); the API answers 503/404 meanwhile."""
        if self.controller is None:
            return
        ctl, self.controller = self.controller, None
        self.registry.remove(self)
        self.metrics.jobs.set(len(self.registry))
        with contextlib.suppress(Exception):
            await ctl.close()

    # ---------------------------------------------------------------- the loop
    def steps(self) -> list[tuple[str, Callable[[], Awaitable[StepResult]]]]:
        from rljob_operator.reconcile import lifecycle, spec

        return [
            ("finish", lambda: lifecycle.ensure_finished(self)),
            ("children", lambda: spec.ensure_children(self)),
            ("suspend", lambda: lifecycle.ensure_suspension(self)),
            ("engines", lambda: ensure_engines(self)),
        ]

    async def run_pass(self) -> float:
        """One reconcile pass and status write; seconds until the next pass."""
        if not self.acting():
            return self.resync_seconds
        started = time.perf_counter()
        step = "pass"
        try:
            step, result = await run_steps(self.steps())
            step = "status"
            await self.publish(result.reason or "pass")
            self._errors, self._last_error = 0, ""
            delay = result.after if result.after is not None else self.resync_seconds
        except Exception as e:
            self._errors += 1
            self.metrics.reconcile_errors.labels(self.namespace, self.name, step).inc()
            msg = f"{step}: {type(e).__name__}: {e}"
            log.exception("reconcile of %s/%s failed in %s", self.namespace, self.name, step)
            if msg != self._last_error:
                self.recorder.record("Warning", Reason.ReconcileError, msg[:1000])
                self._last_error = msg
            delay = min(ERROR_BACKOFF_MAX, 0.5 * 2 ** min(self._errors, 6))
        finally:
            self.metrics.reconciles.labels(self.namespace, self.name).inc()
            self.metrics.reconcile_seconds.labels(self.namespace, self.name).observe(time.perf_counter() - started)
        return max(MIN_PASS_SECONDS, min(delay, self.resync_seconds))

    async def run(self, stopped: Any) -> None:
        """Loop until kopf sets `stopped` (deletion, operator exit or lost leadership)."""
        self.recorder.start()
        try:
            while not stopped:
                delay = await self.run_pass()
                await self._sleep(delay, stopped)
        finally:
            from rljob_operator.reconcile.delete import release_job

            await release_job(self)

    async def _sleep(self, seconds: float, stopped: Any) -> None:
        async def stop_wait() -> None:
            await stopped.wait()

        wake = asyncio.ensure_future(self._wake.wait())
        stop = asyncio.ensure_future(stop_wait())
        try:
            await asyncio.wait({wake, stop}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            stop.cancel()
        self._wake.clear()


async def ensure_engines(rt: JobRuntime) -> StepResult:
    """Run one controller pass: observe cells, create/heal/scale them, probe the due ones."""
    spec = rt.spec()
    if rt.platform_generation != rt.generation and hasattr(rt.platform, "update_job"):
        rt.platform.update_job(rt.job_object())  # new cells are built from the edited spec
        rt.platform_generation = rt.generation
    ctl = rt.ensure_controller(spec.inference)
    delay = await ctl.reconcile()
    await ctl.probe_health()
    return StepResult.requeue(delay, "engines")
