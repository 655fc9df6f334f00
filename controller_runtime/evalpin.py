"""Eval-fleet pinning: evaluate only on the checkpoint the user named, or say why not.

`update_weights_from_disk(checkpoint, version)` on every eval engine, then every engine must
report that version, then a readiness probe. The answer is plain data (`EvalFleet`): the
executor receives it over the API and never sees controller state. A fleet that cannot be
pinned is skipped with a reason (`pin_violation`, `unhealthy`) rather than evaluated on the
wrong weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controller_runtime.clock import Clock, RealClock
from controller_runtime.deadline import call_within
from controller_runtime.ports import EngineClient, EngineClientFactory

PIN_VIOLATION = "pin_violation"
UNHEALTHY = "unhealthy"
NOT_CONFIGURED = "not_configured"  # the job has no eval fleet


@dataclass(frozen=True)
class EvalFleet:
    endpoints: list[str]
    pinned_version: str | None
    checkpoint: str
    ok: bool
    skip_reason: str | None = None
    message: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalFleet:
        return cls(**data)


async def pin_eval_fleet(
    endpoints: Sequence[str],
    engines: EngineClientFactory,
    checkpoint: str,
    version: str,
    *,
    clock: Clock | None = None,
    load_timeout: float = 600.0,
    probe_timeout: float = 30.0,
) -> EvalFleet:
    """Load `checkpoint` as `version` on every eval engine and verify it; never raises on engine faults."""
    clients = [engines(e) for e in endpoints]
    try:
        return await pin_eval_clients(
            clients, checkpoint, version, clock=clock, load_timeout=load_timeout, probe_timeout=probe_timeout
        )
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


async def pin_eval_clients(
    clients: Sequence[EngineClient],
    checkpoint: str,
    version: str,
    *,
    skip_load: Collection[str] = (),
    clock: Clock | None = None,
    load_timeout: float = 600.0,
    probe_timeout: float = 30.0,
) -> EvalFleet:
    """`pin_eval_fleet` over clients the caller owns; engines whose endpoint is in `skip_load` are
    only verified (already pinned: reloading a large checkpoint is not free)."""
    clock = clock or RealClock()
    endpoints = [c.endpoint for c in clients]
    if not clients:
        return EvalFleet(endpoints, version, checkpoint, False, UNHEALTHY, "the eval fleet has no engine")
    loading = [c for c in clients if c.endpoint not in skip_load]
    failed = await _failures(
        clock, [c.update_weights_from_disk(checkpoint, version) for c in loading], [c.endpoint for c in loading],
        load_timeout,
    )
    if failed:
        return EvalFleet(endpoints, version, checkpoint, False, UNHEALTHY,
                         "loading the checkpoint failed: " + "; ".join(failed))
    return await verify_eval_fleet(clients, checkpoint, version, clock=clock, probe_timeout=probe_timeout)


async def verify_eval_fleet(
    clients: Sequence[EngineClient],
    checkpoint: str,
    version: str,
    *,
    clock: Clock | None = None,
    probe_timeout: float = 30.0,
) -> EvalFleet:
    """Every engine reports `version` and answers a readiness probe."""
    clock = clock or RealClock()
    endpoints = [c.endpoint for c in clients]
    results = await asyncio.gather(
        *(call_within(clock, c.get_weight_version(), probe_timeout) for c in clients), return_exceptions=True
    )
    versions: dict[str, str | None] = {}
    unreadable: list[str] = []
    for endpoint, result in zip(endpoints, results, strict=True):
        if isinstance(result, BaseException):
            unreadable.append(f"{endpoint}: {type(result).__name__}: {result}")
        else:
            versions[endpoint] = result
    if unreadable:
        return EvalFleet(endpoints, version, checkpoint, False, UNHEALTHY,
                         "reading the weight version failed: " + "; ".join(unreadable), versions)
    wrong = {e: v for e, v in versions.items() if v != version}
    if wrong:
        listed = ", ".join(f"{e} serves {v!r}" for e, v in sorted(wrong.items()))
        return EvalFleet(endpoints, version, checkpoint, False, PIN_VIOLATION,
                         f"pinned to {version!r} but {listed}", versions)
    failed = await _failures(clock, [c.health() for c in clients], endpoints, probe_timeout)
    if failed:
        return EvalFleet(endpoints, version, checkpoint, False, UNHEALTHY,
                         "readiness probe failed: " + "; ".join(failed), versions)
    return EvalFleet(endpoints, version, checkpoint, True, None, "", versions)


async def _failures(clock: Clock, calls: list[Any], endpoints: list[str], seconds: float) -> list[str]:
    results = await asyncio.gather(*(call_within(clock, c, seconds) for c in calls), return_exceptions=True)
    return [
        f"{e}: {type(r).__name__}: {r}"
        for e, r in zip(endpoints, results, strict=True)
        if isinstance(r, BaseException)
    ]
