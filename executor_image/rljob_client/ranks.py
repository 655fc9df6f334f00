"""How trainer ranks agree that a weight version is live before they ask for the next rollout.

Only the writer rank (rank 0) talks to the controller and pushes weights. Every other rank
must not `get(step)` before rank 0 has put the new version on the fleet *and* told the
executor (`set_weight_version`): the executor freezes a batch against the version it knows,
so a rank that asks early gets a batch of the old weights even with maxStaleness 0.

The ranks already share a torch.distributed process group (gradient all-reduce). Rank 0
publishes the live version in that group's key-value store (`rljob/live/<step>`) and the
others wait for the key. The store, not a gloo collective, because the writer's side of the
barrier can legitimately take long (the first push waits for the fleet to start, up to its
startup deadline) while a gloo collective gives up after the group's timeout; and not the
controller's `cells.weightVersion`, because that becomes the new version before rank 0 has
told the executor (a rank could read a rollout of the old weights), and it would poll the
operator once per rank.

A dead rank must not leave the others hanging or failing without a name. Each rank records
the phase it is in (`rljob/at/<rank>`) and a heartbeat (`rljob/alive/<rank>`, every
`HEARTBEAT_SECONDS`). When a collective fails (gloo answers a dead peer's closed socket at
once) or a wait runs out, `failure()` waits a few heartbeats and names the ranks whose
heartbeat stopped, with the phase each was last in. Rank 0 hosts the store, so a store that
stops answering names rank 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
import time
from typing import Any, Protocol

from rljob_client.errors import RLJobError

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
STALE_HEARTBEATS = 3  # a rank whose heartbeat did not move for this many periods is gone
POLL_SECONDS = 2.0  # one store wait; between waits the deadline is checked


class RankFailed(RLJobError, RuntimeError):
    """Another trainer rank died or hung; the message names it."""


class RankSync(Protocol):
    """What the loop needs from its peers; `SingleRank` when there are none."""

    rank: int
    world_size: int

    def at(self, phase: str) -> None:
        """Record the phase this rank enters (named in a peer's failure message)."""

    async def share_version(self, step: int, version: int | None) -> int:
        """The writer publishes `version` as live for `step`; every other rank waits for it and returns it."""

    async def failure(self, exc: BaseException, phase: str) -> RankFailed:
        """The error to raise when a collective failed in `phase`, naming the rank that is gone."""

    def offer(self, kind: str, step: int, value: str) -> None:
        """A non-writer rank hands `value` (e.g. its RNG state after `step`) to the writer."""

    async def collect(self, kind: str, step: int) -> list[str]:
        """The writer's side of `offer`: the values of ranks 1..world_size-1 for `step`, in rank order."""

    def close(self) -> None: ...


class SingleRank:
    """One rank: nothing to agree with."""

    rank = 0
    world_size = 1

    def at(self, phase: str) -> None:
        return None

    async def share_version(self, step: int, version: int | None) -> int:
        if version is None:
            raise ValueError("the only rank is the writer: it must pass the version")
        return version

    async def failure(self, exc: BaseException, phase: str) -> RankFailed:
        return RankFailed(f"rank 0: {phase} failed: {type(exc).__name__}: {exc}")

    def offer(self, kind: str, step: int, value: str) -> None:
        raise ValueError("the only rank is the writer: it has no one to offer to")

    async def collect(self, kind: str, step: int) -> list[str]:
        return []

    def close(self) -> None:
        return None


class StoreRanks:
    """Ranks of one process group, agreeing through its key-value store (see the module docstring)."""

    def __init__(self, store: Any, rank: int, world_size: int, *, timeout_seconds: float = 3600.0,
                 heartbeat_seconds: float = HEARTBEAT_SECONDS) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_seconds = timeout_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self._phase = "starting"
        self._stop = threading.Event()
        self._beats = 0
        self.store.set(self._key("at", rank), self._phase)
        self.store.set(self._key("alive", rank), "0")
        self._thread = threading.Thread(target=self._heartbeat, name=f"rljob-rank{rank}-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def from_process_group(cls, **kwargs: Any) -> StoreRanks:
        """The default process group's store (torch.distributed initialised by the caller)."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        return cls(store, dist.get_rank(), dist.get_world_size(), **kwargs)

    @staticmethod
    def _key(kind: str, rank_or_step: int) -> str:
        return f"rljob/{kind}/{rank_or_step}"

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            self._beats += 1
            try:
                self.store.set(self._key("alive", self.rank), str(self._beats))
            except Exception:  # the store's host (rank 0) is gone: the next wait or collective says so
                return

    def at(self, phase: str) -> None:
        self._phase = phase
        with contextlib.suppress(Exception):
            self.store.set(self._key("at", self.rank), phase)

    async def share_version(self, step: int, version: int | None) -> int:
        key = self._key("live", step)
        if self.rank == 0:
            if version is None:
                raise ValueError("the writer rank must pass the version it made live")
            await asyncio.to_thread(self.store.set, key, str(version))
            if step >= 2:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.delete_key, self._key("live", step - 2))
            return version
        self.at(f"step {step}: waiting for rank 0 to make the weights live")
        return int(await self._wait_for(key, 0, f"the weights of step {step}", f"make the weights of step {step} live"))

    def offer(self, kind: str, step: int, value: str) -> None:
        if self.rank == 0:
            raise ValueError("the writer rank collects, it does not offer")
        self.store.set(f"rljob/{kind}/{step}/{self.rank}", value)

    async def collect(self, kind: str, step: int) -> list[str]:
        out = []
        for peer in range(1, self.world_size):
            key = f"rljob/{kind}/{step}/{peer}"
            out.append((await self._wait_for(key, peer, f"rank {peer}'s {kind} of step {step}",
                                             f"hand over its {kind} of step {step}")).decode())
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.store.delete_key, key)
        return out

    async def _wait_for(self, key: str, peer: int, waiting_for: str, late: str) -> bytes:
        """The value of `key` once `peer` set it; RankFailed when the store is gone or `timeout_seconds` pass."""
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            try:
                await asyncio.to_thread(self.store.wait, [key], datetime.timedelta(seconds=POLL_SECONDS))
                value: bytes = await asyncio.to_thread(self.store.get, key)
                return value
            except Exception as exc:  # DistStoreError: a wait that timed out; DistNetworkError: the store is gone
                if not _is_wait_timeout(exc):
                    raise RankFailed(f"rank {self.rank}: rank 0 is gone (its store stopped answering) while "
                                     f"waiting for {waiting_for}: {_first_line(exc)}") from exc
                if time.monotonic() > deadline:
                    raise RankFailed(f"rank {self.rank}: rank {peer} did not {late} within "
                                     f"{self.timeout_seconds:g} s (rank {peer} last at: {self._phase_of(peer)!r})"
                                     ) from exc

    def _phase_of(self, rank: int) -> str:
        try:
            return self.store.get(self._key("at", rank)).decode()
        except Exception:
            return "<unknown>"

    def _beats_of(self, others: list[int]) -> dict[int, str | None]:
        out: dict[int, str | None] = {}
        for r in others:
            try:
                out[r] = self.store.get(self._key("alive", r)).decode()
            except Exception:
                out[r] = None
        return out

    async def failure(self, exc: BaseException, phase: str) -> RankFailed:
        others = [r for r in range(self.world_size) if r != self.rank]
        try:
            before = await asyncio.to_thread(self._beats_of, others)
            await asyncio.sleep(self.heartbeat_seconds * STALE_HEARTBEATS)
            after = await asyncio.to_thread(self._beats_of, others)
        except Exception:
            before = after = {}
        if not after or all(v is None for v in after.values()):
            gone = "rank 0 (it hosts the process group's store, which stopped answering)"
        else:
            dead = [r for r in others if after.get(r) is None or after.get(r) == before.get(r)]
            gone = ", ".join(f"rank {r} (no heartbeat for {self.heartbeat_seconds * STALE_HEARTBEATS:g} s; "
                             f"last at {self._phase_of(r)!r})" for r in dead) or "no rank stopped its heartbeat"
        return RankFailed(f"rank {self.rank}: {phase} failed because a peer rank is gone: {gone}; "
                          f"{type(exc).__name__}: {_first_line(exc)}")

    def close(self) -> None:
        self._stop.set()


def _is_wait_timeout(exc: BaseException) -> bool:
    """A store wait that ran out (the key is not there yet), as opposed to a store that is gone."""
    import torch.distributed as dist

    network_error = getattr(dist, "DistNetworkError", ())
    return not isinstance(exc, network_error) and "timeout" in str(exc).lower()


def _first_line(exc: BaseException) -> str:
    """torch's errors carry a C++ stack after the first line."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
