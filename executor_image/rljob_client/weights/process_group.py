"""`gloo` / `nccl`: the weight transport that broadcasts into a process group of the window.

Plugs into `weights/context.py`'s `WeightTransport` seam. Nothing is staged on disk: each
push forms a new group with exactly the engines of the open window (a cell recreated since
the snapshot is not among them and never joins), broadcasts the policy's weights in buckets
(`rljob_client.weights.broadcast`), and tears the group down before the window ends, so the
next window forms a fresh group with whoever participates then.

With `weightUpdate.checkWeights` the engines keep the sha256 of every tensor they received and
the transport puts the trainer's own checksums on the window (`window.expected_checksums`):
the controller compares them at `end_update_weights` and fails the window naming any tensor
that differs or is missing.

One deviation from the seam's contract: when the broadcast itself fails, the engines stay
paused (they may hold part of the new weights and must not serve them); the loop aborts the
window, which recreates every participant. A failure before any weight moved resumes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from rljob_client.weights.broadcast import (
    WeightBroadcaster,
    WeightReceiver,
    WeightTransferFailed,
    expected_checksums,
    named_tensors,
    receiver_for,
)
from rljob_client.weights.native_nccl import use_native

if TYPE_CHECKING:
    from rljob_client.controller_client import WeightUpdateWindow
    from rljob_client.weights.context import TransportContext, Weights

log = logging.getLogger(__name__)


class DistributedTransport:
    """Bucketed broadcast from the writer rank to every engine worker of the window."""

    def __init__(self, context: TransportContext, backend: str,
                 receiver: Callable[[Any], WeightReceiver] = receiver_for) -> None:
        self.context = context
        self.receiver = receiver
        self.broadcaster = WeightBroadcaster(
            backend,
            bucket_bytes=context.bucket_bytes,
            timeout_s=context.transfer_timeout_seconds,
            pause_mode=context.pause_mode,
        )
        self.dtype = torch.bfloat16

    async def stage(self, model: torch.nn.Module, version: int) -> None:
        """Nothing to write: the bytes leave the trainer's memory inside the window."""

    async def push(self, window: WeightUpdateWindow, version: int, model: Weights) -> None:
        if model is None:
            raise ValueError(f"weights v{version}: a process-group push needs the tensors, not a staged directory")
        tensors = named_tensors(model, self.dtype) if isinstance(model, torch.nn.Module) else model
        clients = [self.context.engines(e.endpoint) for e in window.engines]
        try:
            receivers = [self.receiver(c) for c in clients]
            workers = [max(1, e.gpu_count) for e in window.engines]
            verify = self.context.check_weights
            # the trainer hashes what it sends while it sends it (hashlib leaves the GIL)
            hashing = asyncio.ensure_future(asyncio.to_thread(expected_checksums, tensors)) if verify else None
            try:
                report = await self.broadcaster.update(receivers, tensors, str(version), workers, digest=verify)
            finally:
                checksums = await hashing if hashing is not None else None
            if checksums is not None:
                window.expected_checksums = checksums
            window.pushed.extend(e.cell for e in window.engines)
            log.info("weights v%d (%s): %.1f MB to %d engines in %.2f s (%s)", version, self.broadcaster.backend,
                     report.bytes / 1e6, len(receivers), report.seconds.get("total", 0.0), report.seconds)
        except TypeError as exc:  # an engine kind without a process-group receiver
            raise WeightTransferFailed("plan", [e.endpoint for e in window.engines], exc) from exc
        finally:
            for c in clients:
                await c.close()

    async def close(self) -> None:
        """No group outlives its window."""


def gloo_transport(context: TransportContext) -> DistributedTransport:
    return DistributedTransport(context, "gloo")


def nccl_transport(context: TransportContext) -> DistributedTransport:
    """GPU engines: vLLM's own NCCL weight-transfer engine where `use_native` allows it, else the
    rljob extension's receive with CUDA buffers."""
    native = use_native(context.check_weights)
    return DistributedTransport(context, "nccl", receiver=lambda c: receiver_for(c, native_nccl=native))
