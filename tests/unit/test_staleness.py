"""Weight versions only go forward; samples older than maxStaleness versions are refused."""

from __future__ import annotations

import pytest
from rollout_executor.staleness import VersionTracker, WeightVersionError


def test_version_cannot_go_backwards() -> None:
    t = VersionTracker(max_staleness=1)
    assert t.set(3) == 3
    assert t.set("3") == 3
    with pytest.raises(WeightVersionError, match="backwards: 3 -> 2"):
        t.set(2)
    with pytest.raises(WeightVersionError, match="not an integer"):
        t.set("v4")
    assert t.current == 3


@pytest.mark.parametrize(("max_staleness", "fresh_from"), [(0, 5), (1, 4), (3, 2)])
def test_fresh_means_at_most_max_staleness_behind(max_staleness: int, fresh_from: int) -> None:
    t = VersionTracker(max_staleness=max_staleness)
    t.set(5)
    assert [v for v in range(6) if t.is_fresh(v)] == list(range(fresh_from, 6))


def test_stale_groups_are_those_with_any_old_sample() -> None:
    t = VersionTracker(max_staleness=1)
    t.set(4)
    assert t.stale_groups({0: [4, 4], 1: [3, 2], 2: [3, 3]}) == [1]
    t.count_drop(1, 2)
    assert (t.dropped_groups, t.dropped_samples) == (1, 2)
