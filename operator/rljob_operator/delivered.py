"""What kopf's RLJob watch delivered, per job: the relist's proof that an event was not lost.

kopf spawns a job's daemon some time after its event arrives (after an operator restart with
many jobs, the last daemons run many seconds later), so "no runtime yet" alone does not tell a
lost ADDED event from a slow spawn. The RLJob event handler (`handlers.wake_rljob`) records
every event here, before kopf spawns or stops the daemon; `relist.plan` nudges only jobs with
no record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Delivered:
    """The last event kopf's watch delivered of one (namespace, name)."""

    uid: str
    deleting: bool  # it carried the deletion mark


def record_delivered(
    delivered: dict[tuple[str, str], Delivered], event_type: str | None, body: Mapping[str, Any]
) -> None:
    """Keeps the last event per key; a DELETED one ends the record (the object is gone, and a
    new one of that name has its own uid)."""
    meta = body.get("metadata") or {}
    key = (meta.get("namespace") or "", meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    if event_type == "DELETED":
        if key in delivered and delivered[key].uid == uid:
            del delivered[key]
        return
    delivered[key] = Delivered(uid=uid, deleting=bool(meta.get("deletionTimestamp")))
