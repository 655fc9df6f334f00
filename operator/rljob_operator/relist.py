"""One periodic LIST of RLJobs for the whole operator: what kopf's watch lost, made up.

kopf lists once, then watches from the last resourceVersion it saw, across reconnects; it
lists again only after a `410 Gone` (kopf/_cogs/clients/watching.py, `continuous_watch`),
and nothing outside kopf can make it restart its stream. A watch event lost on the way (a
proxy, a connection cut mid-event) is lost for good: a new RLJob never gets its daemon, a
spec edit never reaches its job, a deletion is never acted on. Rather than a GET of each RLJob
per resync period, one LIST per period covers every job and every kind of lost event:

- a job listed newer (by generation) than kopf's view: the listed body goes to its runtime,
  which acts on the newer of the two (a generation never goes back, so a stale list never
  undoes a newer spec);
- a job kopf holds no runtime for, or whose deletion kopf has not seen, on two lists in a
  row, and of which kopf's watch never delivered an event (for that uid; for a deletion, one
  with the deletion mark): an annotation is written on it, so that kopf's watch sees a
  MODIFIED event and does what it missed (spawns the daemon, or stops it and removes the
  finalizer). A delivered event is enough: kopf spawns a job's daemon (seconds later
  after an operator restart with many jobs) or stops it on its own once it has the event, so
  a nudge then is a needless write and one more event in a queue that is already long;
- a runtime whose RLJob is not listed: a GET confirms the job is gone (a stale list never
  stops a live job), then the runtime ends.

`plan` is the decision, apart from the calls; `Relister` makes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller_runtime.clock import ticks
from rljob_operator.delivered import Delivered
from rljob_operator.kinds import GROUP

log = logging.getLogger(__name__)

NUDGE_ANNOTATION = f"{GROUP}/relisted"  # its value: the resourceVersion the relist saw
Key = tuple[str, str]  # (namespace, name)


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def key_of(body: Mapping[str, Any]) -> Key:
    return (_meta(body).get("namespace") or "", _meta(body).get("name") or "")


@dataclass(frozen=True)
class Plan:
    """What one relist does, and what it carries to the next."""

    feed: dict[Key, Mapping[str, Any]] = field(default_factory=dict)  # to each job's runtime
    nudge: dict[Key, str] = field(default_factory=dict)  # key -> the resourceVersion listed
    maybe_gone: tuple[Key, ...] = ()  # runtimes whose job was not listed (a GET confirms)
    behind: frozenset[Key] = frozenset()  # kopf behind on this list: nudged if still on the next
    forget: tuple[Key, ...] = ()  # delivered records of keys not listed (the object is gone)


def plan(
    listed: Iterable[Mapping[str, Any]],
    watched: Mapping[Key, Mapping[str, Any]],
    behind_before: frozenset[Key],
    delivered: Mapping[Key, Delivered],
) -> Plan:
    """Compare one LIST with kopf's view of each job (the body of its runtime, `watched`,
    and the events its watch delivered, `delivered`, both taken before the LIST was sent so
    that a job created since is not taken for gone).

    kopf is behind on a job when its watch never delivered the job (no event of its uid) and
    it holds no runtime for it (outside its deletion), or never delivered the deletion mark
    the list shows and its view lacks: once is a race with the watch (the event may be on its
    way), twice in a row is a lost event. A job kopf has an event of but no runtime for yet is
    waiting for its daemon to be spawned: not behind.
    """
    feed: dict[Key, Mapping[str, Any]] = {}
    nudge: dict[Key, str] = {}
    behind: set[Key] = set()
    seen: set[Key] = set()
    keys: set[Key] = set()
    for body in listed:
        key, meta = key_of(body), _meta(body)
        keys.add(key)
        deleting = bool(meta.get("deletionTimestamp"))
        view = watched.get(key)
        same = view is not None and _meta(view).get("uid") == meta.get("uid")
        if same:
            seen.add(key)
            feed[key] = body
        got = delivered.get(key)
        if got is not None and got.uid != meta.get("uid"):
            got = None  # an event of an earlier object of that name
        missed_added = not same and not deleting and got is None
        missed_deletion = (
            same
            and deleting
            and view is not None
            and not _meta(view).get("deletionTimestamp")
            and not (got is not None and got.deleting)
        )
        if missed_added or missed_deletion:
            behind.add(key)
            if key in behind_before:
                nudge[key] = str(meta.get("resourceVersion") or "")
    gone = tuple(sorted(k for k in watched if k not in seen))
    forget = tuple(sorted(k for k in delivered if k not in keys))
    return Plan(feed=feed, nudge=nudge, maybe_gone=gone, behind=frozenset(behind), forget=forget)


class ListedJob(Protocol):
    """What the relister needs of a job's runtime (`job_runtime.JobRuntime`)."""

    watched: Mapping[str, Any]

    def observe_listed(self, body: Mapping[str, Any]) -> None: ...

    def end(self) -> None: ...


class RelistKube(Protocol):
    async def list_rljobs(self, namespace: str | None) -> list[dict[str, Any]]: ...

    async def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def annotate_rljob(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...


@dataclass
class Relister:
    """The operator-wide relist loop; runs next to kopf while this replica leads."""

    kube: RelistKube
    runtimes: Mapping[Key, ListedJob]
    namespaces: Sequence[str | None]  # (None,) for cluster-wide
    period: float
    acting: Callable[[], bool] = lambda: True
    behind: frozenset[Key] = frozenset()
    delivered: dict[Key, Delivered] = field(default_factory=dict)  # `record_delivered`, from kopf's events
    lists: int = 0  # LIST rounds done (a test counts them)
    nudges: int = 0  # annotations written (a test counts them)

    async def run(self, stop: asyncio.Event) -> None:
        async with contextlib.aclosing(ticks(stop, self.period, at_once=False)) as rounds:
            async for _ in rounds:
                if not self.acting():
                    continue
                try:
                    await self.once()
                except Exception:
                    log.exception("relist of RLJobs failed; trying again in %.0f s", self.period)

    async def once(self) -> Plan:
        before = dict(self.runtimes)
        watched = {k: rt.watched for k, rt in before.items()}
        delivered = dict(self.delivered)
        listed: list[dict[str, Any]] = []
        for ns in self.namespaces:
            listed += await self.kube.list_rljobs(ns)
        self.lists += 1
        p = plan(listed, watched, self.behind, delivered)
        self.behind = p.behind
        for key, body in p.feed.items():
            rt = self.runtimes.get(key)
            if rt is not None:
                rt.observe_listed(body)
        for (ns, name), rv in p.nudge.items():
            log.warning("kopf missed an event of RLJob %s/%s: nudging its watch", ns, name)
            await self.kube.annotate_rljob(ns, name, {NUDGE_ANNOTATION: rv})
            self.nudges += 1
        for key in p.forget:
            if self.delivered.get(key) is delivered[key]:  # no event of it since the LIST was sent
                del self.delivered[key]
        for key in p.maybe_gone:
            await self._end_if_gone(key, before[key])
        return p

    async def _end_if_gone(self, key: Key, rt: ListedJob) -> None:
        if self.runtimes.get(key) is not rt:
            return  # ended or replaced since the list
        stored = await self.kube.get_rljob(*key)
        if stored is None or _meta(stored).get("uid") != _meta(rt.watched).get("uid"):
            log.warning("RLJob %s/%s is gone but kopf missed its deletion: ending its runtime", *key)
            rt.end()
