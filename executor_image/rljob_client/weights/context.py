"""What every weight transport shares: its contract, its context and the concurrent push.

Apart from `transport.py` (the table of transports) so that a transport module imports only
this, never the table that lists it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from controller_runtime.api.control import EngineEndpoint
from controller_runtime.api.spec import PauseMode
from controller_runtime.ports import EngineClient
from rljob_client.controller_client import WeightUpdateWindow
from rljob_client.weights.disk import DiskWeightWriter

log = logging.getLogger(__name__)

EngineFactory = Callable[[str], EngineClient]
# What a push carries: a whole model (the reference trainer), a name -> tensor map (the SDK's
# process-group path), or None where the version is already staged (the disk path).
Weights = torch.nn.Module | Mapping[str, torch.Tensor] | None
DEFAULT_PUSH_CONCURRENCY = 8


class WeightTransport(Protocol):
    """Moves one weight version into the engines of an open window (see the module docstring)."""

    async def stage(self, model: torch.nn.Module, version: int) -> None: ...

    async def push(self, window: WeightUpdateWindow, version: int, model: Weights) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TransportContext:
    """What any transport may need from the loop; a new transport adds fields with defaults."""

    engines: EngineFactory
    pause_mode: PauseMode
    sync_dir: Path
    source_model_dir: Path
    keep_versions: int = 2
    concurrency: int = DEFAULT_PUSH_CONCURRENCY
    writer: DiskWeightWriter | None = None
    bucket_bytes: int = 512 * 2**20  # gloo/nccl: weightUpdate.bucketMegabytes
    transfer_timeout_seconds: float = 120.0  # gloo/nccl: weightUpdate.transferTimeoutSeconds
    check_weights: bool = False  # send the trainer's checksums for the controller to compare


async def push_all(window: WeightUpdateWindow, concurrency: int,
                   one: Callable[[EngineEndpoint], Awaitable[None]]) -> None:
    """Run `one` for every engine of the window, at most `concurrency` at once.

    Every engine's push runs to its end even when another one fails (cancelling a push half
    way could leave its engine paused); then the first failure is raised, which aborts the
    window. `window.pushed` lists the cells that completed, in the window's order.
    """
    gate = asyncio.Semaphore(max(1, concurrency))

    async def bounded(engine: EngineEndpoint) -> None:
        async with gate:
            await one(engine)

    results = await asyncio.gather(*(bounded(e) for e in window.engines), return_exceptions=True)
    failures: list[BaseException] = []
    for engine, result in zip(window.engines, results, strict=True):
        if isinstance(result, BaseException):
            failures.append(result)
            log.warning("weights: %s (%s) failed: %s: %s", engine.cell, engine.endpoint, type(result).__name__, result)
        else:
            window.pushed.append(engine.cell)
    if failures:
        raise failures[0]


