"""Status conditions merged the way Kubernetes' `meta.SetStatusCondition` does.

`lastTransitionTime` moves only when `status` changes, so `kubectl describe` shows how long a
condition has held; reason/message/observedGeneration are refreshed in place. Conditions are
plain camelCase dicts here because that is what lives in `status` and what kopf hands us.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.status import ConditionType

ORDER = [c.value for c in ConditionType]


@dataclass(frozen=True)
class Want:
    """A condition as the reconciler wants it now (no times: merging decides them)."""

    type: str
    status: bool | None  # None -> Unknown
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else ("True" if self.status else "False")


def merge_conditions(
    current: Sequence[Mapping[str, Any]] | None,
    wanted: Iterable[Want],
    now_iso: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """New condition list: wanted ones set, others kept, known types in a stable order."""
    by_type: dict[str, dict[str, Any]] = {c["type"]: dict(c) for c in (current or []) if "type" in c}
    for w in wanted:
        old = by_type.get(str(w.type))
        new: dict[str, Any] = {"type": str(w.type), "status": w.status_text, "reason": w.reason, "message": w.message}
        if old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime"):
            new["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            new["lastTransitionTime"] = now_iso
        if generation is not None:
            new["observedGeneration"] = generation
        by_type[str(w.type)] = new

    def key(t: str) -> tuple[int, str]:
        return (ORDER.index(t) if t in ORDER else len(ORDER), t)

    return [by_type[t] for t in sorted(by_type, key=key)]


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for c in conditions or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    c = find(conditions, type_)
    return c is not None and c.get("status") == "True"


def transitions(
    before: Sequence[Mapping[str, Any]] | None, after: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """Conditions whose status changed (or appeared): each deserves an Event."""
    out = []
    for c in after:
        old = find(before, c["type"])
        if old is None or old.get("status") != c.get("status") or old.get("reason") != c.get("reason"):
            out.append(c)
    return out
