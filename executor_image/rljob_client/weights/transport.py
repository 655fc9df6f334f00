"""How a weight version travels from the trainer into the engines of an open window.

The training loop owns the window (open, abort on failure, retry, end) and the executor's
gate around it; a transport only moves bytes. Splitting the two lets a second way of moving
weights (a process-group broadcast, `weightUpdate.method: nccl`) sit beside the disk one
without touching the window logic.

The contract, kept stable for other transports:

    class WeightTransport(Protocol):
        async def stage(self, model, version) -> None         # once per version, outside any window
        async def push(self, window, version, model) -> None  # every engine of the open window
        async def close(self) -> None

- `stage` is called once per new version before the window opens (disk: write the model
  directory; a broadcast transport may do nothing). A re-push of the current version (a fleet
  whose only cells were recreated) calls `push` again without `stage`.
- `push` must put `version` into *every* engine of `window.engines` and append each engine's
  cell to `window.pushed` as it is done. It raises (an `EngineError` for engine faults, which
  the loop retries in a new window) when any engine fails; it must not return while an engine
  is still paused by it, so the aborted window leaves no engine paused by us.
- Engines are pushed concurrently (at most `concurrency` at once): window time should not
  grow with the fleet, and the fleet should serve mixed versions for as short a time as possible.

`make_transport(method, context)` picks the transport of `spec.inference.weightUpdate.method`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import torch

from controller_runtime.api.control import EngineEndpoint
from controller_runtime.api.spec import PauseMode, WeightUpdateMethod
from controller_runtime.ports import EngineClient
from rljob_client.controller_client import WeightUpdateWindow
from rljob_client.weights.context import (
    DEFAULT_PUSH_CONCURRENCY,
    EngineFactory,
    TransportContext,
    Weights,
    WeightTransport,
    push_all,
)
from rljob_client.weights.disk import DiskWeightWriter
from rljob_client.weights.process_group import gloo_transport, nccl_transport

__all__ = ["DEFAULT_PUSH_CONCURRENCY", "TRANSPORTS", "DiskTransport", "EngineFactory", "TransportContext",
           "WeightTransport", "Weights", "make_transport", "push_all", "push_from_disk"]

log = logging.getLogger(__name__)

async def push_from_disk(client: EngineClient, path: str, version: int, pause_mode: PauseMode) -> None:
    """One engine: pause -> reload weights from `path` -> set the version -> resume.

    Resume is attempted even when the reload fails, so an engine is never left paused by us;
    the failure still propagates and aborts the window.
    """
    await client.pause(pause_mode)
    try:
        await client.update_weights_from_disk(path, str(version))
    finally:
        await client.resume()


class DiskTransport:
    """`disk`: write a full model directory once per version, then every engine reloads it in parallel."""

    def __init__(self, context: TransportContext) -> None:
        self.context = context
        self.writer = context.writer or DiskWeightWriter(context.sync_dir, context.source_model_dir,
                                                         keep=context.keep_versions, bucket_bytes=context.bucket_bytes)

    async def stage(self, model: torch.nn.Module, version: int) -> None:
        await asyncio.to_thread(self.writer.save, model, version)

    async def push(self, window: WeightUpdateWindow, version: int, model: Weights) -> None:
        path = str(self.writer.path_for(version).resolve())

        async def one(engine: EngineEndpoint) -> None:
            client = self.context.engines(engine.endpoint)
            try:
                await push_from_disk(client, path, version, self.context.pause_mode)
            finally:
                await client.close()

        await push_all(window, self.context.concurrency, one)

    async def close(self) -> None:
        """Nothing is held between windows."""


TRANSPORTS: dict[WeightUpdateMethod, Callable[[TransportContext], WeightTransport]] = {
    WeightUpdateMethod.disk: DiskTransport,
    WeightUpdateMethod.gloo: gloo_transport,
    WeightUpdateMethod.nccl: nccl_transport,
}


def make_transport(method: WeightUpdateMethod, context: TransportContext) -> WeightTransport:
    """The transport of `spec.inference.weightUpdate.method`."""
    factory = TRANSPORTS.get(method)
    if factory is None:
        raise ValueError(f"weightUpdate.method {method.value!r}: the reference trainer has no transport for it "
                         f"(available: {', '.join(m.value for m in TRANSPORTS)})")
    return factory(context)
