"""The controller lock as data: acquire, expiry, snapshot checks, status round-trip."""

from __future__ import annotations

import pytest

from controller_runtime.api.status import LockStatus
from controller_runtime.errors import LockHeld, SnapshotMismatch
from controller_runtime.lock import ControllerLock, WindowLock

NOW = 1_700_000_000.0


def test_second_acquire_is_refused_naming_the_holder() -> None:
    lock = ControllerLock(600)
    lock.acquire("trainer-0", {"j-cell-0": 0}, NOW)
    with pytest.raises(LockHeld, match="trainer-0"):
        lock.acquire("trainer-1", {"j-cell-0": 0}, NOW)


def test_expiry_is_holder_time_plus_timeout() -> None:
    lock = ControllerLock(600)
    held = lock.acquire("t", {}, NOW)
    assert held.expires == NOW + 600
    assert lock.expired(NOW + 599) is None
    assert lock.expired(NOW + 600) is held


def test_check_accepts_the_snapshot_as_json_would_carry_it() -> None:
    lock = ControllerLock(600)
    lock.acquire("t", {"j-cell-0": 1, "j-cell-1": 0}, NOW)
    assert lock.check({"j-cell-1": 0, "j-cell-0": 1}).holder == "t"
    with pytest.raises(SnapshotMismatch):
        lock.check({"j-cell-0": 2, "j-cell-1": 0})
    with pytest.raises(SnapshotMismatch):
        lock.check({"j-cell-0": 1})


def test_check_without_an_open_window_is_a_mismatch() -> None:
    with pytest.raises(SnapshotMismatch, match="no update window"):
        ControllerLock(600).check({})


def test_status_round_trip_keeps_holder_snapshot_expiry_and_checksums() -> None:
    held = WindowLock("t", NOW, NOW + 600, {"j-cell-0": 3}, {"j-cell-0": {"w": "abc"}})
    wire = held.to_status().to_wire()
    assert wire["snapshot"] == {"j-cell-0": 3} and wire["weightsChecksums"] == {"j-cell-0": {"w": "abc"}}
    lock = ControllerLock(600)
    lock.restore(LockStatus.model_validate(wire), NOW)
    assert lock.current == held
    lock.restore(None, NOW)
    assert not lock.held
