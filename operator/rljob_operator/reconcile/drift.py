"""Whether a child as stored still holds what the operator applied: the resync's question.

Re-applying every child on a timer repairs drift, but each apply is a write the API server
serves (and persists when the managed-fields timestamp moves), whether or not anything
changed, every child of every job at every resync. A read answers the same question for the
price of a read, so the resync reads each child and applies only the ones that are missing or
differ.

`holds(live, desired)` is containment, not equality: the API server adds defaults, status,
managed fields and other managers' fields, none of which is drift. Every key the operator sets
must be there with the same value (lists element by element, same length; a value the
operator leaves empty may be absent). Anything the server normalises differently from how the
builder wrote it reads as drift and costs one apply per resync, as before: never a missed repair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _empty(v: Any) -> bool:
    return v is None or v == {} or v == [] or v == ""


def holds(live: Any, desired: Any) -> bool:
    """Whether `live` contains every field and value of `desired`."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return _empty(live) and all(_empty(v) for v in desired.values())
        return all(holds(live[k], v) if k in live else _empty(v) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list):
            return _empty(live) and not desired
        return len(live) == len(desired) and all(holds(a, b) for a, b in zip(live, desired, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return live is desired
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return live == desired
    return live == desired or (live is None and _empty(desired))
