"""The two ports through which the controller touches the world.

`Platform` creates, deletes and observes engine cells (Kubernetes pods in the operator,
local processes in `rljob run`). `EngineClient` is one engine's HTTP API, the same shape for
vLLM and SGLang so that the controller's logic never branches on the engine.
Both are Protocols: adapters live outside this package (operator) or beside it (clients/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from controller_runtime.api.spec import MemoryTag, PauseMode


@dataclass(frozen=True)
class PodObservation:
    """One pod (or local process) of a cell as the platform sees it."""

    name: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ip: str | None = None
    ready: bool = False
    restarts: int = 0
    node: str | None = None
    message: str = ""
    missing: bool = False  # the cell's shape has it, the platform has none (phase Unknown)


@dataclass(frozen=True)
class CellObservation:
    """A cell as it exists on the platform right now.

    `generation` is the recreation counter the platform stamped on the cell's pods (a label
    on Kubernetes), so a controller restarted from scratch can tell a recreated cell from the
    one a window snapshot names.
    """

    name: str
    index: int
    generation: int
    pods: tuple[PodObservation, ...] = ()
    endpoint: str | None = None  # http://host:port of the cell's head engine, once known

    @property
    def all_running(self) -> bool:
        return bool(self.pods) and all(p.phase == "Running" for p in self.pods)

    @property
    def any_failed(self) -> bool:
        return any(p.phase in ("Failed", "Succeeded", "Unknown") for p in self.pods)

    @property
    def restarts(self) -> int:
        return sum(p.restarts for p in self.pods)

    @property
    def incomplete(self) -> bool:
        """Some pods are missing and none of the others failed or restarted: a creation that did
        not finish (the API server refused a pod), or a pod that went before anything ran."""
        present = [p for p in self.pods if not p.missing]
        return len(present) < len(self.pods) and not any(
            p.phase in ("Failed", "Succeeded", "Unknown") or p.restarts for p in present)  # fmt: skip

    def failures(self) -> str:
        """Its failed or restarted pods, as a cell's status message names them."""
        return ", ".join(f"{p.name} {p.phase} (restarts {p.restarts})" for p in self.pods
                         if p.phase in ("Failed", "Succeeded", "Unknown") or p.restarts)  # fmt: skip


class CellRole(StrEnum):
    """Which of the job's fleets a cell belongs to (see `fleet.Fleet`)."""

    policy = "policy"  # takes weight updates, serves rollouts
    eval = "eval"  # pinned to spec.inference.eval's checkpoint


@dataclass(frozen=True)
class CellRequest:
    """What the controller asks the platform to create: cell `index` at `generation`.

    Plain facts only: how a platform marks its objects (Kubernetes labels, process names) is
    the platform's business, so the operator's manifests turn these fields into labels.
    `labels` are extra ones the controller's owner asked for, passed through unchanged.
    `serving` asks for the cell to be created in the serving set, to join it once its engine is
    ready; the controller asks it only of a platform whose `admits_when_ready` is true.
    """

    name: str
    index: int
    generation: int
    labels: dict[str, str] = field(default_factory=dict)
    role: CellRole = CellRole.policy
    serving: bool = False


class Platform(Protocol):
    # True where the serving set only ever holds cells whose engine answers, whatever they are
    # marked (Kubernetes: the `-engines` Service lists Ready pods only, and the head pod's
    # readinessProbe is the engine's health): a cell that will serve the weights it starts with
    # can then be created serving, and no `set_serving` (a pod label PATCH per cell of every new
    # job) is needed when it comes up. False where marking a cell is all it takes for traffic to
    # reach it (local processes).
    admits_when_ready: bool

    async def create_cell(self, request: CellRequest) -> None:
        """Create every pod of the cell, serving as `request.serving` says and not serving otherwise
        (no `set_serving` is needed to keep a new cell out of the serving set). Idempotent: names
        are deterministic from (name, generation)."""
        ...

    async def delete_cell(self, name: str) -> None:
        """Delete every pod of the cell (any generation). Idempotent."""
        ...

    async def observe_cells(self) -> Sequence[CellObservation]:
        """Every cell the platform holds for this job."""
        ...

    async def set_serving(self, name: str, serving: bool) -> None:
        """Mark the cell as a member (or not) of the serving set (on Kubernetes, a pod label)."""
        ...

    def update_job(self, job: Mapping[str, Any]) -> None:
        """The job's object changed (a spec edit, a new admission): cells created from now on
        are built from it. A no-op where cells do not depend on it (local processes, fakes)."""
        ...


class EngineClient(Protocol):
    """One engine's control and data surface, engine-neutral."""

    endpoint: str

    async def health(self) -> None:
        """Raise an EngineError unless the engine is healthy (vLLM /health, SGLang /health_generate)."""
        ...

    async def pause(self, mode: PauseMode = PauseMode.wait) -> None: ...

    async def resume(self) -> None: ...

    async def release_memory(self, tags: Sequence[MemoryTag]) -> None: ...

    async def resume_memory(self, tags: Sequence[MemoryTag]) -> None: ...

    async def flush_cache(self) -> None: ...

    async def update_weights_from_disk(self, path: str, version: str | None = None) -> None: ...

    async def get_weight_version(self) -> str | None: ...

    async def set_weight_version(self, version: str) -> None: ...

    async def weight_checksums(self) -> dict[str, str]:
        """tensor name -> checksum (vLLM /weight_checker, SGLang /weights_checker)."""
        ...

    async def abort_all(self) -> None: ...

    async def close(self) -> None: ...


class EngineClientFactory(Protocol):
    def __call__(self, endpoint: str) -> EngineClient: ...
