"""Write the RLJob status from what was observed, then Events for the conditions that changed.

One writer per job, and writes are serialised: the reconcile loop and the controller API
(which records every call's effect in `status` before it answers) both write through it.
What to write is decided by `status.build_status` from an `Observed` the caller assembles
from the values the steps returned; only the difference to what is stored goes out, as a
merge patch, so a pass that changed nothing writes nothing; a pass whose only news is when
the cells were last probed, a failed probe below the threshold, or a young Pending cell's pods
and endpoint, writes nothing either (`job_status.quiet_delta`). A pass that saw some cells of a
starting job come up while others still start holds that news for up to
`STARTUP_HOLD_SECONDS` (`job_status.startup_progress`): the pass that finds the rest started
writes it all at once, or the first pass past the hold writes what there is. Writes that record
a controller call's effect are never held: the call answers after its write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rljob_operator.interned import interned
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.job_status import (
    STARTUP_HOLD_SECONDS,
    Observed,
    build_status,
    is_news,
    quiet_delta,
    startup_progress,
    status_delta,
)

log = logging.getLogger(__name__)


WARNINGS = frozenset({("EnginesHealthy", "False"), ("Failed", "True"), ("TrainerWorkload", "False")})


def is_warning(c: Mapping[str, Any]) -> bool:
    return (c["type"], c["status"]) in WARNINGS


class StatusWriter:
    def __init__(self, job: JobContext, metrics: Metrics, stored: Mapping[str, Any] | None) -> None:
        self.job = job
        self.metrics = metrics
        self.stored: dict[str, Any] = dict(stored or {})  # the status as the API server last answered it
        self._lock = asyncio.Lock()
        self._held_since: float | None = None  # when start-up progress began to wait (module docstring)

    def hold_left(self, now: float) -> float | None:
        """Seconds until held start-up progress is due to be written; None when nothing is held."""
        if self._held_since is None:
            return None
        return max(0.0, self._held_since + STARTUP_HOLD_SECONDS - now)

    async def write(self, observe: Callable[[], Observed], why: str, may_hold: bool = False) -> None:
        """Write what `observe()` returns, called under the write lock.

        Called there, not before, so that of two racing writers (a pass and an API call) the
        one that writes last also observed last: a stale snapshot never overwrites a newer one.
        `may_hold`: a pass's write, which start-up progress may put off (module docstring).
        """
        async with self._lock:
            obs = observe()
            conditions_before = self.stored.get("conditions")
            status, changed = build_status(self.stored, obs)
            delta = status_delta(self.stored, status)
            quiet = not delta or quiet_delta(self.stored, delta, obs.now)
            if quiet or not (may_hold and startup_progress(self.stored, status, delta)):
                self._held_since = None  # nothing to hold: written now, or nothing to write
            else:
                if self._held_since is None:
                    self._held_since = obs.now
                quiet = obs.now < self._held_since + STARTUP_HOLD_SECONDS
            if quiet:
                # the gauges follow what the controller holds (probe ages, failure counts), written or not
                self.metrics.observe_status(self.job.namespace, self.job.name, {**self.stored, **delta})
                return
            obj = await self.job.kube.patch_rljob_status(self.job.namespace, self.job.name, delta)
            # kept until the next write, for every job: its strings shared with the other jobs'
            self.stored = interned(obj.get("status") or status)
            self.metrics.observe_status(self.job.namespace, self.job.name, self.stored)
            before = {c.get("type") for c in (conditions_before or [])}
            for c in changed:
                if c["type"] not in before and not is_news(c):
                    continue  # a condition's first, unremarkable value is not an event
                self.job.recorder.record(
                    "Warning" if is_warning(c) else "Normal",
                    c.get("reason") or c["type"],
                    f"{c['type']}={c['status']}" + (f": {c['message']}" if c.get("message") else ""),
                )
            log.debug("status written (%s): %s", why, sorted(delta), extra={"job": self.job.key})
