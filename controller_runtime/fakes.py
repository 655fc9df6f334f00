"""In-memory fakes of the two ports, for unit tests of the controller's logic only.

`FakePlatform` keeps cells in a dict and lets a test kill, restart or remove pods;
`FakeEngines` hands out one `FakeEngine` per endpoint whose health, hangs, garbage answers,
memory and weights a test controls. Integration tests use the real adapters (Kubernetes,
local processes, vLLM); these exist so that the state machine can be tested in milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from controller_runtime.api.spec import MemoryTag, PauseMode
from controller_runtime.errors import EngineError, EngineProtocolError, EngineUnavailable
from controller_runtime.ports import CellObservation, CellRequest, PodObservation


@dataclass
class FakeCell:
    request: CellRequest
    pods: list[PodObservation]
    endpoint: str | None


class FakePlatform:
    """A platform whose cells exist the moment they are created (pods Running unless told otherwise)."""

    def __init__(self, *, start_running: bool = True, admits_when_ready: bool = False, pods_per_cell: int = 1) -> None:
        self.start_running = start_running
        self.pods_per_cell = pods_per_cell
        self.admits_when_ready = admits_when_ready
        self.cells: dict[str, FakeCell] = {}
        self.created: list[CellRequest] = []
        self.deleted: list[str] = []
        self.serving: dict[str, bool] = {}
        self.serving_calls: list[tuple[str, bool]] = []
        self.fail_delete = False
        self.fail_create = False
        self.refuse_pods: set[int] = set()  # pod indexes create_cell leaves missing, then raises

    @staticmethod
    def endpoint_of(name: str, generation: int) -> str:
        return f"http://{name}-g{generation}.fake:8000"

    async def create_cell(self, request: CellRequest) -> None:
        """Creates what is absent, as the Kubernetes platform's POSTs do (409 is success): a cell
        of this generation gets its missing pods back; `refuse_pods` leaves those missing and
        raises after the others were made, as a refused POST beside accepted ones does."""
        if self.fail_create:
            raise RuntimeError("fake platform: create refused")
        phase = "Running" if self.start_running else "Pending"
        existing = self.cells.get(request.name)
        if existing is None or existing.request.generation != request.generation:
            self.created.append(request)
            pods = [PodObservation(f"{request.name}-g{request.generation}-{i}", phase) for i in range(self.pods_per_cell)]
            endpoint = self.endpoint_of(request.name, request.generation) if self.start_running else None
            existing = self.cells[request.name] = FakeCell(request, pods, endpoint)
            self.serving[request.name] = request.serving  # as asked; not serving by default (the port's contract)
        refused = [i for i in self.refuse_pods if i < len(existing.pods)]
        existing.pods = [
            PodObservation(p.name, "Unknown", message="pod missing", missing=True) if i in refused
            else replace(p, phase=phase, missing=False, message="") if p.missing else p
            for i, p in enumerate(existing.pods)
        ]  # fmt: skip
        if refused:
            raise RuntimeError(f"fake platform: pods {refused} of {request.name} refused")

    def update_job(self, job: Mapping[str, Any]) -> None:
        """Fake cells are built from their request alone."""

    async def delete_cell(self, name: str) -> None:
        if self.fail_delete:
            raise RuntimeError("fake platform: delete refused")
        self.deleted.append(name)
        self.cells.pop(name, None)

    async def observe_cells(self) -> Sequence[CellObservation]:
        return [
            CellObservation(name, c.request.index, c.request.generation, tuple(c.pods), c.endpoint)
            for name, c in self.cells.items()
        ]

    async def set_serving(self, name: str, serving: bool) -> None:
        self.serving_calls.append((name, serving))
        self.serving[name] = serving

    # -- test controls ----------------------------------------------------------------------

    def run_pods(self, name: str) -> None:
        cell = self.cells[name]
        cell.pods = [replace(p, phase="Running") for p in cell.pods]
        cell.endpoint = self.endpoint_of(name, cell.request.generation)

    def fail_pod(self, name: str, pod: int = 0) -> None:
        cell = self.cells[name]
        cell.pods[pod] = replace(cell.pods[pod], phase="Failed")

    def lose_pod(self, name: str, pod: int = 0) -> None:
        """The pod is gone (deleted, never made): observed as the Kubernetes platform reports it."""
        cell = self.cells[name]
        cell.pods[pod] = PodObservation(cell.pods[pod].name, "Unknown", message="pod missing", missing=True)

    def restart_pod(self, name: str, pod: int = 0) -> None:
        cell = self.cells[name]
        cell.pods[pod] = replace(cell.pods[pod], restarts=cell.pods[pod].restarts + 1)

    def generation_of(self, name: str) -> int | None:
        cell = self.cells.get(name)
        return None if cell is None else cell.request.generation


@dataclass
class FakeEngine:
    """One engine. Flip the public fields to make it fail, hang, or answer garbage."""

    endpoint: str
    healthy: bool = True
    hang: bool = False
    garbage: bool = False
    health_gate: asyncio.Event | None = None  # when set, health() waits for it first
    flush_failures: int = 0  # flush_cache fails this many times before succeeding
    fail: set[str] = field(default_factory=set)  # method names that raise EngineError
    released: set[MemoryTag] = field(default_factory=set)
    weight_version: str | None = None
    checksums: dict[str, str] = field(default_factory=lambda: {"w": "init"})
    paused: bool = False
    closed: bool = False
    calls: list[str] = field(default_factory=list)
    health_started: int = 0

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        if method in self.fail:
            raise EngineUnavailable(self.endpoint, f"{method} refused (fake)")

    async def health(self) -> None:
        self.health_started += 1
        self._enter("health")
        if self.health_gate is not None:
            await self.health_gate.wait()
        if self.hang:
            await asyncio.Event().wait()
        if self.garbage:
            raise EngineProtocolError(self.endpoint, "expected JSON, got b'\\x00garbage'")
        if not self.healthy:
            raise EngineUnavailable(self.endpoint, "connection refused (fake)")

    async def pause(self, mode: PauseMode = PauseMode.wait) -> None:
        self._enter("pause")
        self.paused = True

    async def resume(self) -> None:
        self._enter("resume")
        self.paused = False

    async def release_memory(self, tags: Sequence[MemoryTag]) -> None:
        self._enter("release_memory")
        self.released.update(MemoryTag(t) for t in tags)

    async def resume_memory(self, tags: Sequence[MemoryTag]) -> None:
        self._enter("resume_memory")
        self.released.difference_update(MemoryTag(t) for t in tags)

    async def flush_cache(self) -> None:
        self._enter("flush_cache")
        if self.flush_failures > 0:
            self.flush_failures -= 1
            raise EngineError(self.endpoint, "requests in flight (fake)")

    async def update_weights_from_disk(self, path: str, version: str | None = None) -> None:
        self._enter("update_weights_from_disk")
        self.checksums = {"w": f"disk:{path}"}
        if version is not None:
            self.weight_version = version

    async def get_weight_version(self) -> str | None:
        self._enter("get_weight_version")
        return self.weight_version

    async def set_weight_version(self, version: str) -> None:
        self._enter("set_weight_version")
        self.weight_version = version

    async def weight_checksums(self) -> dict[str, str]:
        self._enter("weight_checksums")
        return dict(self.checksums)

    async def abort_all(self) -> None:
        self._enter("abort_all")

    async def close(self) -> None:
        self.closed = True


class FakeEngines:
    """EngineClientFactory: one FakeEngine per endpoint, kept so tests can reach it."""

    def __init__(self) -> None:
        self.engines: dict[str, FakeEngine] = {}

    def __call__(self, endpoint: str) -> FakeEngine:
        if endpoint not in self.engines:
            self.engines[endpoint] = FakeEngine(endpoint)
        return self.engines[endpoint]


async def settle(controller: object, passes: int = 3) -> None:
    """Run `passes` reconcile + probe passes of an InferenceController (tests drive time themselves)."""
    for _ in range(passes):
        await controller.reconcile()  # type: ignore[attr-defined]
        await controller.probe_health()  # type: ignore[attr-defined]
