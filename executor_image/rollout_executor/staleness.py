"""The weight version the executor generates under, and which samples are too old to train on.

Versions are integers that only go forward (`set` to a smaller one is an error, as in miles).
A sample generated under version v may be handed to a trainer while the current version c
satisfies c - v <= max_staleness; older ones are dropped (their whole GRPO group, since
advantages are relative within a group) and regenerated, and the drop is counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from rljob_client.errors import RLJobError


class WeightVersionError(RLJobError, ValueError):
    """A weight version that goes backwards or is not an integer."""


def parse_version(v: int | str) -> int:
    try:
        out = int(v)
    except (TypeError, ValueError) as e:
        raise WeightVersionError(f"weight version {v!r} is not an integer") from e
    if out < 0:
        raise WeightVersionError(f"weight version {v!r} is negative")
    return out


@dataclass
class VersionTracker:
    max_staleness: int
    current: int = 0
    dropped_samples: int = 0
    dropped_groups: int = 0

    def set(self, version: int | str) -> int:
        v = parse_version(version)
        if v < self.current:
            raise WeightVersionError(f"weight version may not go backwards: {self.current} -> {v}")
        self.current = v
        return v

    def staleness(self, sample_version: int) -> int:
        return self.current - sample_version

    def is_fresh(self, sample_version: int) -> bool:
        return self.staleness(sample_version) <= self.max_staleness

    def stale_groups(self, versions_by_group: dict[int, list[int]]) -> list[int]:
        """Groups holding at least one sample that is too old."""
        return sorted(g for g, vs in versions_by_group.items() if any(not self.is_fresh(v) for v in vs))

    def count_drop(self, groups: int, samples: int) -> None:
        self.dropped_groups += groups
        self.dropped_samples += samples
