"""History invariants, read from the kube-apiserver's audit log (tests/cluster/audit-policy.yaml),
not from the operator's own view.

After a test, the events of its namespace are checked for:

* one live pod per (job, cell, pod index): a cell's pod is created only once every earlier
  pod of that slot had its deletion requested (a terminating pod still holds its GPUs, but
  it no longer serves: "live" is created and not yet asked to go);
* nothing created for a job after its deletion was requested (pods and applied children);
* `status.observedGeneration` never goes backwards (the operator's status patches carry it
  whenever it changes); a job deleted and created again under its name starts afresh, here
  and in the restart counts;
* one writer at a time: every write of an operator replica (user agent
  `rljob-operator/<identity>`) comes from the holder of the namespace's Lease as last written;
* every cell's restart count equals the recreations the log shows (generations created
  after the first), when the test recreated cells only through faults (no aborted windows).

Pure functions over parsed events, so the checks are unit-tested on made-up histories.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POD_NAME = re.compile(r"^(?P<job>.+)-cell-(?P<cell>\d+)-g(?P<gen>\d+)-(?P<pod>\d+)$")
OPERATOR_AGENT = "rljob-operator/"
WRITES = ("create", "update", "patch", "delete")


@dataclass(frozen=True)
class Event:
    at: str  # stageTimestamp (RFC 3339, sortable)
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    agent: str
    body: dict[str, Any]

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Event:
        ref = raw.get("objectRef") or {}
        body = raw.get("requestObject") or {}
        name = ref.get("name") or (body.get("metadata") or {}).get("name") or ""
        return cls(raw.get("stageTimestamp", ""), raw.get("verb", ""), ref.get("resource", ""),
                   ref.get("subresource", ""), ref.get("namespace", ""), name,
                   int((raw.get("responseStatus") or {}).get("code", 0)), raw.get("userAgent", ""), body)  # fmt: skip

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300

    @property
    def creates(self) -> bool:
        """A successful create, or a server-side apply that created the object (201)."""
        return self.ok and (self.verb == "create" or (self.verb == "patch" and self.code == 201))


def audit_log(cluster: Any) -> Path:
    """Where the test cluster's kube-apiserver writes its audit log (tests/cluster/up)."""
    return Path(cluster.cache) / "kwok" / "clusters" / cluster.name / "logs" / "audit.log"


def read(path: Path, namespace: str) -> list[Event]:
    """The completed requests of `namespace`, in order."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"{namespace}"' not in line:
            continue
        raw = json.loads(line)
        if (
            raw.get("stage") == "ResponseComplete"
            and (raw.get("objectRef") or {}).get("namespace") == namespace
        ):
            out.append(Event.parse(raw))
    return sorted(out, key=lambda e: e.at)


def one_live_pod_per_slot(events: Iterable[Event]) -> list[str]:
    live: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    problems = []
    for e in events:
        m = POD_NAME.match(e.name) if e.resource == "pods" and not e.subresource else None
        if m is None or not e.ok:
            continue
        slot = (m["job"], m["cell"], m["pod"])
        if e.creates:
            if live[slot]:
                problems.append(f"{e.at}: {e.name} created while {sorted(live[slot])} still live")
            live[slot].add(e.name)
        elif e.verb == "delete":
            live[slot].discard(e.name)
    return problems


def _job_of(name: str, jobs: Iterable[str]) -> str | None:
    return next((j for j in jobs if name == j or name.startswith(f"{j}-")), None)


def nothing_created_after_deletion(events: Iterable[Event]) -> list[str]:
    deleted: dict[str, str] = {}
    problems = []
    for e in events:
        if e.resource == "rljobs" and not e.subresource:
            if e.verb == "delete" and e.ok:
                deleted.setdefault(e.name, e.at)
            elif e.creates:
                deleted.pop(e.name, None)  # a new job of the same name
            continue
        job = _job_of(e.name, deleted) if e.creates else None
        if job is not None:
            problems.append(
                f"{e.at}: {e.resource}/{e.name} created after RLJob {job} was deleted at {deleted[job]}"
            )
    return problems


def observed_generation_never_goes_back(events: Iterable[Event]) -> list[str]:
    last: dict[str, int] = {}
    problems = []
    for e in events:
        if e.resource == "rljobs" and not e.subresource and e.creates:
            last.pop(e.name, None)  # a new job of the same name: its generations start again
        if e.resource != "rljobs" or e.subresource != "status" or not e.ok:
            continue
        value = (e.body.get("status") or {}).get("observedGeneration")
        if not isinstance(value, int):
            continue
        if value < last.get(e.name, value):
            problems.append(f"{e.at}: {e.name} observedGeneration {last[e.name]} -> {value}")
        last[e.name] = value
    return problems


def only_the_lease_holder_writes(events: Iterable[Event]) -> list[str]:
    holder: str | None = None
    problems = []
    for e in events:
        if e.resource == "leases":
            if e.ok and e.verb in ("create", "update"):
                holder = (e.body.get("spec") or {}).get("holderIdentity") or None
            continue
        if e.verb in WRITES and e.agent.startswith(OPERATOR_AGENT):
            identity = e.agent[len(OPERATOR_AGENT) :].split(" ")[0]
            if identity != holder:
                problems.append(
                    f"{e.at}: {identity} wrote {e.verb} {e.resource}/{e.name} while {holder} held the Lease"
                )
    return problems


def restarts_match_recreations(events: Iterable[Event], statuses: dict[str, dict[str, Any]]) -> list[str]:
    generations: dict[tuple[str, str], set[int]] = defaultdict(set)
    for e in events:
        if e.resource == "rljobs" and not e.subresource and e.creates:  # a new job of that name
            for key in [k for k in generations if k[0] == e.name]:
                del generations[key]
        m = POD_NAME.match(e.name) if e.resource == "pods" and e.creates else None
        if m is not None:
            generations[(m["job"], f"{m['job']}-cell-{m['cell']}")].add(int(m["gen"]))
    problems = []
    for job, status in statuses.items():
        for cell in status.get("engines") or []:
            seen = len(generations.get((job, cell["name"]), ())) - 1
            if seen >= 0 and cell.get("restarts", 0) != seen:
                problems.append(
                    f"{cell['name']}: restarts {cell.get('restarts', 0)}, recreations seen {seen}"
                )
    return problems


def violations(events: list[Event], statuses: dict[str, dict[str, Any]]) -> Iterator[str]:
    yield from one_live_pod_per_slot(events)
    yield from nothing_created_after_deletion(events)
    yield from observed_generation_never_goes_back(events)
    yield from only_the_lease_holder_writes(events)
    yield from restarts_match_recreations(events, statuses)
