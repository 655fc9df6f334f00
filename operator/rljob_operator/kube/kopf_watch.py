"""The one change the operator makes inside kopf: RLJob bodies without `metadata.managedFields`.

kopf keeps the latest body of every RLJob for as long as its daemon runs, and managedFields
(the API server's record of which writer owns which field, nearly half a body once a job has
cells) are read by no one here. kopf's settings offer no filter of what its watch stores and
the API server none of what it sends, so kopf's watch stream (`continuous_watch` in its private
`kopf._cogs.clients.watching`) is wrapped. This is the only module that touches kopf's private
modules (`pyproject.toml`'s contract); kopf is pinned in the lock, and
`tests/unit/test_operator_wiring.py` fails if a kopf release moves the seam.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kopf._cogs.clients import watching as kopf_watching

from rljob_operator.interned import interned


def without_managed_fields(raw_event: Any) -> Any:
    """The watch event with its object's `metadata.managedFields` removed and its strings shared
    with the other jobs' bodies (`interned`: kopf keeps this object for as long as the job's
    daemon runs); bookmarks and errors pass as they are. The event dict is changed in place:
    it is fresh from the stream's JSON, no one else holds it yet."""
    obj = raw_event.get("object") if isinstance(raw_event, dict) else None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        raw_event["object"] = interned(obj)
    return raw_event


def keep_managed_fields_out_of_kopf() -> None:
    """Every RLJob body kopf hands over (and keeps) comes without `metadata.managedFields`:
    kopf's `continuous_watch`, which yields the listing's objects and the watch's alike and which
    its `infinite_watch` looks up by name at every reconnect, is wrapped once per process."""
    inner = kopf_watching.continuous_watch
    if getattr(inner, "drops_managed_fields", False):
        return

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        async for raw_event in inner(**kwargs):
            yield without_managed_fields(raw_event)

    continuous_watch.drops_managed_fields = True  # type: ignore[attr-defined]
    kopf_watching.continuous_watch = continuous_watch
