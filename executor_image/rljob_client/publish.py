"""Publishing one weight version: the executor's gate around an update window, retried until it lands.

The order every trainer needs and none should repeat: close the executor's gate
(`begin_weight_update`: spec.rollout.onWeightUpdate drains or aborts in-flight requests), open
a window and push to every engine of it (the transport), `end_update_weights`, tell the
executor the new version, reopen the gate. An engine fault aborts the window and retries in a
new one; a fleet with no engine ready yet is waited for up to the startup deadline. The gate
reopens even when the push fails, at the old version: a failed sync must not stop generation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from controller_runtime.errors import EngineError, NoReadyEngines, WeightCheckMismatch
from rljob_client.controller_client import ControllerClient
from rljob_client.errors import RLJobError
from rljob_client.weights.context import Weights, WeightTransport

log = logging.getLogger(__name__)


class WeightSyncFailed(RLJobError, RuntimeError):
    """Weights could not be pushed within the allowed attempts."""


class WeightGate(Protocol):
    """The executor's side of an update: its gate and its weight version (the writer rank only)."""

    async def set_weight_version(self, version: int) -> None: ...

    async def begin_weight_update(self) -> Any: ...

    async def end_weight_update(self, version: int | None = None) -> Any: ...


@dataclass(frozen=True)
class PublishSettings:
    holder: str
    fleet_timeout_seconds: float = 1800.0  # waiting for an engine to take weights at all
    max_update_attempts: int = 30
    retry_seconds: float = 2.0
    ready_timeout_seconds: float | None = None  # a window waits this long for starting cells


class WeightPublisher:
    """The writer rank's gate -> window -> transport -> version sequence (module docstring)."""

    def __init__(self, controller: ControllerClient, gate: WeightGate, settings: PublishSettings,
                 on_status: Callable[[str], None] | None = None) -> None:
        self.controller = controller
        self.gate = gate
        self.settings = settings
        self.on_status = on_status

    def _status(self, text: str) -> None:
        log.info("%s", text)
        if self.on_status is not None:
            self.on_status(text)

    async def sync(self, version: int, transport: WeightTransport, weights: Weights) -> int:
        """Push `version` inside the executor's gate; returns the attempts it took."""
        await self.gate.begin_weight_update()
        reopen_at: int | None = None
        try:
            attempts = await self.push(version, transport, weights)
            await self.gate.set_weight_version(version)
            reopen_at = version
        finally:
            await self.gate.end_weight_update(reopen_at)
        return attempts

    async def push(self, version: int, transport: WeightTransport, weights: Weights) -> int:
        """Open windows until one completes: engine faults abort and retry, an empty fleet waits."""
        s = self.settings
        loop = asyncio.get_running_loop()
        fleet_deadline = loop.time() + s.fleet_timeout_seconds
        attempt = 0
        while True:
            try:
                async with self.controller.update_weights(s.holder, weight_version=str(version),
                                                          ready_timeout=s.ready_timeout_seconds) as window:
                    self._status(f"weights v{version}: pushing to {len(window.engines)} engines")
                    opened = loop.time()
                    await transport.push(window, version, weights)
                    log.info("weights v%d: pushed to %d engines in %.2f s", version, len(window.engines),
                             loop.time() - opened)
                return attempt + 1
            except NoReadyEngines as exc:
                if loop.time() > fleet_deadline:
                    raise WeightSyncFailed(f"no engine could take weights v{version} within "
                                           f"{s.fleet_timeout_seconds:g} s: {exc}") from exc
                self._status(f"weights v{version}: waiting for engines ({exc})")
            except (EngineError, WeightCheckMismatch) as exc:  # a failed check aborted the window too
                attempt += 1
                log.warning("weights v%d: attempt %d failed (%s); window aborted", version, attempt, exc)
                if attempt >= s.max_update_attempts:
                    raise WeightSyncFailed(f"weights v{version}: {attempt} attempts failed; last: {exc}") from exc
            await asyncio.sleep(s.retry_seconds)

    async def fleet_waits_for_weights(self) -> bool:
        """No engine serves but some wait for weights: only a re-push of the current version unblocks them."""
        from controller_runtime.api.status import CellState

        cells = await self.controller.cells()
        return not cells.serving_endpoints and any(e.state is CellState.PendingWeights for e in cells.engines)


async def abort_orphan_window(controller: ControllerClient, holder: str) -> bool:
    """Abort a window this trainer's previous incarnation left open (it died inside it).

    Its engines may hold half-pushed weights; aborting recreates them, and waiting for the
    lock to expire would only delay that. A window of another holder is left alone.
    """
    cells = await controller.cells()
    if cells.lock is None or cells.lock.holder != holder:
        return False
    log.warning("aborting the update window %s left open by a previous run of this trainer", cells.lock.snapshot)
    await controller.abort_update_weights(dict(cells.lock.snapshot))
    return True
