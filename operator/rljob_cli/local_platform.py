"""`LocalPlatform`: engine cells as local vLLM processes, for `rljob run`.

The same InferenceController that drives pods on Kubernetes drives these processes: it
creates a cell (a process on a free 127.0.0.1 port), observes it (a running process is a
Running pod, an exited one a Failed pod), probes its health over HTTP, and deletes and
recreates it when it is unhealthy. One cell is one process here (local mode refuses
multi-GPU cells, see `capacity.py`), so a cell's "pod" is its process.

The process I/O sits behind `EngineLauncher`, so the bookkeeping (idempotent create per
generation, replacement of an older generation, observation of dead processes, the serving
set) is unit-tested with a fake launcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from controller_runtime.ports import CellObservation, CellRequest, PodObservation
from rljob_cli.vllm_process import VLLMArgs, VLLMProcess, free_port

log = logging.getLogger(__name__)


class EngineProcess(Protocol):
    @property
    def endpoint(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    def start(self) -> None: ...

    def returncode(self) -> int | None: ...

    def stop(self, timeout: float = 15.0) -> bool: ...


class EngineLauncher(Protocol):
    def __call__(self, request: CellRequest) -> EngineProcess:
        """A not-yet-started process for this cell generation."""
        ...


@dataclass
class LocalCell:
    request: CellRequest
    process: EngineProcess
    log_path: Path | None = None


def pod_name(request: CellRequest) -> str:
    return f"{request.name}-g{request.generation}"


def observe_process(name: str, returncode: int | None, log_path: Path | None = None) -> PodObservation:
    """A process as a pod: Running while alive; exit 0 is Succeeded, anything else Failed (both end the cell)."""
    if returncode is None:
        return PodObservation(name=name, phase="Running", ip="127.0.0.1", ready=True, node="localhost")
    where = f"; log: {log_path}" if log_path else ""
    return PodObservation(
        name=name,
        phase="Succeeded" if returncode == 0 else "Failed",
        ip="127.0.0.1",
        node="localhost",
        message=f"engine process exited with code {returncode}{where}",
    )


class LocalPlatform:
    """Implements controller_runtime.ports.Platform with local processes."""

    # `serving_endpoints` hands the marked processes to the executor as they are, up or not.
    admits_when_ready = False

    def __init__(self, launcher: EngineLauncher, *, on_spawn: Callable[[str, int | None], None] | None = None,
                 stop_timeout: float = 15.0) -> None:
        self.launcher = launcher
        self.on_spawn = on_spawn
        self.stop_timeout = stop_timeout
        self.cells: dict[str, LocalCell] = {}
        self.serving: dict[str, bool] = {}
        self.spawned = 0
        self._lock = asyncio.Lock()

    def update_job(self, job: Mapping[str, Any]) -> None:
        """Local mode's engines are launched from the spec it started with; a new object changes nothing."""

    async def create_cell(self, request: CellRequest) -> None:
        async with self._lock:
            existing = self.cells.get(request.name)
            if existing is not None:
                if existing.request.generation >= request.generation:
                    return  # idempotent: this generation (or a newer one) already exists
                await self._stop(existing)
            process = self.launcher(request)
            await asyncio.to_thread(process.start)
            self.spawned += 1
            self.cells[request.name] = LocalCell(request, process, getattr(process, "log_path", None))
            self.serving[request.name] = False
            log.info("cell %s generation %d: started pid %s at %s", request.name, request.generation,
                     process.pid, process.endpoint)
            if self.on_spawn is not None:
                self.on_spawn(pod_name(request), process.pid)

    async def delete_cell(self, name: str) -> None:
        async with self._lock:
            cell = self.cells.pop(name, None)
            self.serving.pop(name, None)
            if cell is not None:
                await self._stop(cell)

    async def _stop(self, cell: LocalCell) -> None:
        gone = await asyncio.to_thread(cell.process.stop, self.stop_timeout)
        if not gone:
            log.warning("cell %s: process group of pid %s survived SIGKILL", cell.request.name, cell.process.pid)

    async def observe_cells(self) -> Sequence[CellObservation]:
        return [
            CellObservation(
                name=name,
                index=c.request.index,
                generation=c.request.generation,
                pods=(observe_process(pod_name(c.request), c.process.returncode(), c.log_path),),
                endpoint=c.process.endpoint,
            )
            for name, c in sorted(self.cells.items())
        ]

    async def set_serving(self, name: str, serving: bool) -> None:
        if name in self.cells:
            self.serving[name] = serving

    def serving_endpoints(self) -> list[str]:
        return [c.process.endpoint for n, c in sorted(self.cells.items()) if self.serving.get(n)]

    def pids(self) -> list[int]:
        return [c.process.pid for c in self.cells.values() if c.process.pid is not None]

    async def close(self) -> None:
        """Stop every engine process (in parallel: each may take seconds to exit)."""
        async with self._lock:
            cells, self.cells = list(self.cells.values()), {}
            self.serving.clear()
            await asyncio.gather(*(self._stop(c) for c in cells))


class VLLMLauncher:
    """Starts each cell generation as a vLLM CPU server on a fresh loopback port."""

    def __init__(self, model: str, log_dir: Path, *, tokenizer: str | None = None, extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, max_model_len: int = 512) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.log_dir = log_dir
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.max_model_len = max_model_len

    def __call__(self, request: CellRequest) -> VLLMProcess:
        args = VLLMArgs(model=self.model, port=free_port(), tokenizer=self.tokenizer,
                        max_model_len=self.max_model_len, extra_args=self.extra_args)
        proc = VLLMProcess(args, self.log_dir / f"{pod_name(request)}.log")
        proc.env.update(self.env)
        return proc
