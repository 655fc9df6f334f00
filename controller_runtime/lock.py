"""The controller lock held by an open weight-update window.

Held from `start_update_weights` until `end_update_weights` / `abort_update_weights`, across
several API calls (unlike an asyncio lock), so it is plain data: holder, since, expiry, the
participants' snapshot and (optionally) their weight checksums at window start. It converts
to and from `LockStatus`, so the open window survives an operator restart, expiry included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller_runtime.api.status import LockStatus
from controller_runtime.clock import iso, parse_iso
from controller_runtime.errors import LockHeld, SnapshotMismatch


def normalise_snapshot(snapshot: Mapping[str, int]) -> dict[str, int]:
    """Snapshots travel as JSON: compare them as {str: int}."""
    return {str(k): int(v) for k, v in snapshot.items()}


@dataclass
class WindowLock:
    holder: str
    since: float
    expires: float
    snapshot: dict[str, int]
    checksums: dict[str, dict[str, str]] | None = None

    def expired(self, now: float) -> bool:
        return now >= self.expires

    def to_status(self) -> LockStatus:
        return LockStatus(
            holder=self.holder,
            since=iso(self.since),
            expires=iso(self.expires),
            snapshot=dict(self.snapshot),
            weights_checksums=self.checksums,
        )

    @classmethod
    def from_status(cls, status: LockStatus) -> WindowLock:
        return cls(
            holder=status.holder,
            since=parse_iso(status.since),
            expires=parse_iso(status.expires),
            snapshot=normalise_snapshot(status.snapshot),
            checksums=status.weights_checksums,
        )


@dataclass(frozen=True)
class ClosedWindow:
    """How the last window closed (ended at `version`, or aborted) and what its closing call answered."""

    snapshot: dict[str, int]
    ended: bool
    version: str | None
    cells: list[str]


class ControllerLock:
    """At most one open window. Expiry is detected here and acted upon by the controller.

    `closed` remembers how the last window closed until the next one opens, so that a repeated
    end or abort (its answer lost, or its effect not recorded) gets the first call's answer."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self.current: WindowLock | None = None
        self.closed: ClosedWindow | None = None

    @property
    def held(self) -> bool:
        return self.current is not None

    def acquire(self, holder: str, snapshot: Mapping[str, int], now: float) -> WindowLock:
        if self.current is not None:
            raise LockHeld(
                f"the update window is held by {self.current.holder!r} until {iso(self.current.expires)}"
            )
        self.closed = None
        self.current = WindowLock(
            holder=holder,
            since=now,
            expires=now + self.timeout_seconds,
            snapshot=normalise_snapshot(snapshot),
        )
        return self.current

    def check(self, snapshot: Mapping[str, int]) -> WindowLock:
        """The open window, provided `snapshot` is its snapshot."""
        if self.current is None:
            raise SnapshotMismatch("no update window is open")
        if normalise_snapshot(snapshot) != self.current.snapshot:
            raise SnapshotMismatch(
                f"snapshot {normalise_snapshot(snapshot)} is not the open window's {self.current.snapshot}"
            )
        return self.current

    def repeated_close(self, snapshot: Mapping[str, int], ended: bool, version: str | None = None) -> list[str] | None:
        """The first answer when this end (`ended`) or abort repeats how the last window closed.

        Only with no window open: an open window is always the one a call names. An end repeats
        only an end, with the same version when it names one; an abort only an abort."""
        last = self.closed
        if self.current is not None or last is None or last.ended != ended:
            return None
        if normalise_snapshot(snapshot) != last.snapshot or (ended and version is not None and version != last.version):
            return None
        return list(last.cells)

    def expired(self, now: float) -> WindowLock | None:
        """The open window when it is past its expiry."""
        if self.current is not None and self.current.expired(now):
            return self.current
        return None

    def release(self) -> WindowLock | None:
        released, self.current = self.current, None
        return released

    def restore(self, status: LockStatus | None, now: float) -> None:
        """The window recorded in status, bounded as if this controller had opened it.

        The status is input (anyone allowed to patch it can write a lock), so a start in the
        future counts from now and no expiry lies further than `timeout_seconds` after the
        start: a hand-edited lock "held until 2036" still expires within the spec's timeout.
        """
        if status is None:
            self.current = None
            return
        lock = WindowLock.from_status(status)
        lock.since = min(lock.since, now)
        lock.expires = min(lock.expires, lock.since + self.timeout_seconds)
        self.current = lock
