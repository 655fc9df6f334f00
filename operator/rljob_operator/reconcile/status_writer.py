"""Write the RLJob status from what was observed, then Events for the conditions that changed.

One writer per job, and writes are serialised: the reconcile loop and the controller API
(which records every call's effect in `status` before it answers) both write through it.
What to write is decided by `status.build_status` from an `Observed` the caller assembles
from the values the steps returned; only the difference to what is stored goes out, as a
merge patch, so a pass that changed nothing writes nothing; a pass whose only news is when
the cells were last probed, a failed probe below the threshold, or a young Pending cell's pods
and endpoint, writes nothing either (`job_status.quiet_delta`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rljob_operator.interned import interned
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.job_status import Observed, build_status, quiet_delta, status_delta

log = logging.getLogger(__name__)


def is_news(c: Mapping[str, Any]) -> bool:
    """Whether a condition's value is worth an Event even the first time it is set."""
    bad = {"EnginesHealthy": "False", "Failed": "True", "Suspended": "True", "Ready": "True", "Admitted": "True"}
    return bad.get(c["type"]) == c["status"]


def is_warning(c: Mapping[str, Any]) -> bool:
    return (c["type"] == "EnginesHealthy" and c["status"] == "False") or (c["type"] == "Failed" and c["status"] == "True")


class StatusWriter:
    def __init__(self, job: JobContext, metrics: Metrics, stored: Mapping[str, Any] | None) -> None:
        self.job = job
        self.metrics = metrics
        self.stored: dict[str, Any] = dict(stored or {})  # the status as the API server last answered it
        self._lock = asyncio.Lock()

    async def write(self, observe: Callable[[], Observed], why: str) -> None:
        """Write what `observe()` returns, called under the write lock.

        Called there, not before, so that of two racing writers (a pass and an API call) the
        one that writes last also observed last: a stale snapshot never overwrites a newer one.
        """
        async with self._lock:
            obs = observe()
            conditions_before = self.stored.get("conditions")
            status, changed = build_status(self.stored, obs)
            delta = status_delta(self.stored, status)
            if not delta or quiet_delta(self.stored, delta, obs.now):
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
