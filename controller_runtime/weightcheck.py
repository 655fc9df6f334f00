"""Weight verification after an update (miles' check_weight_update_equal).

At window start the controller records each participant's tensor checksums; at the end it
reads them again. After an update every participant must hold the same weights (data-parallel
engines of one policy), and when the trainer passes the checksums it sent, they must match
those. The comparison is pure; collecting goes through `EngineClient.weight_checksums`.

With the trainer's checksums, an engine that can say what it *received* in the last
process-group update (`ReceivedChecksums`: the vLLM worker extension keeps the sha256 of each
tensor as it arrived) is read that way instead: its own parameters are in kernel layout
(fused projections, padded vocabularies, CPU-repacked matrices) and could never equal what
the trainer hashed. A tensor the trainer expects and the engine did not receive is missing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from controller_runtime.clock import Clock
from controller_runtime.deadline import call_within
from controller_runtime.ports import EngineClient

Checksums = dict[str, dict[str, str]]  # cell -> tensor -> checksum
MISSING = "<missing>"


@runtime_checkable
class ReceivedChecksums(Protocol):
    """An engine client that reports the checksums of the tensors its last update received."""

    async def received_checksums(self) -> dict[str, str]: ...


async def _read(client: EngineClient, received: bool) -> dict[str, str]:
    if received and isinstance(client, ReceivedChecksums):
        return await client.received_checksums()
    return await client.weight_checksums()


async def collect_checksums(
    clients: Mapping[str, EngineClient], clock: Clock, seconds: float, *, received: bool = False
) -> Checksums:
    """Every cell's checksums, read concurrently; a failed read raises (the check cannot pass).

    `received`: read what each engine received in the last update where it can say so.
    """
    names = sorted(clients)
    results = await asyncio.gather(
        *(call_within(clock, _read(clients[n], received), seconds) for n in names)
    )
    return {n: dict(r) for n, r in zip(names, results, strict=True)}


def compare_checksums(
    after: Mapping[str, Mapping[str, str]], expected: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    """cell -> names of tensors that disagree; empty when the check passes.

    With `expected`, each cell must match it tensor by tensor. Without, the reference for a
    tensor is the checksum most cells report (ties: the lowest cell name's), so a single
    deviating engine is named rather than all of them.
    """
    tensors = set(expected or ())
    for sums in after.values():
        tensors.update(sums)
    reference: dict[str, str] = dict(expected) if expected is not None else {}
    if expected is None:
        for tensor in tensors:
            votes = Counter(after[c].get(tensor, MISSING) for c in sorted(after))
            top = max(votes.values())
            reference[tensor] = next(
                after[c].get(tensor, MISSING) for c in sorted(after) if votes[after[c].get(tensor, MISSING)] == top
            )
    mismatched: dict[str, list[str]] = {}
    for cell in sorted(after):
        bad = sorted(t for t in tensors if after[cell].get(t, MISSING) != reference.get(t, MISSING))
        if bad:
            mismatched[cell] = bad
    return mismatched


def changed_tensors(before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    """cell -> how many tensors changed during the window (for the audit log)."""
    return {
        cell: sum(1 for t, v in after[cell].items() if before.get(cell, {}).get(t) != v)
        for cell in sorted(after)
    }
