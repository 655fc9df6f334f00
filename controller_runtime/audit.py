"""The audit log: one JSONL record per controller (or executor) event, one file per component.

Record shape (one line): `{"timestamp": "2026-11-29T09:30:00.123Z", "source": {"component":
"inference_controller", "job": "demo", "cell": "demo-cell-0"}, "type": "cell_transition",
...fields}`. Files are `<component>.jsonl` in a directory (`inference_controller.jsonl`,
`rollout_executor.jsonl`).

miles called the executor `rollout_manager` before the split; `read_audit_log` keeps reading
such logs and reports their component as `rollout_executor`, so tools written against the
new name work on old runs without a migration step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller_runtime.clock import Clock, RealClock

INFERENCE_CONTROLLER = "inference_controller"
ROLLOUT_EXECUTOR = "rollout_executor"
LEGACY_COMPONENTS = {"rollout_manager": ROLLOUT_EXECUTOR}
RESERVED = frozenset({"timestamp", "source", "type"})


def iso_ms(ts: float) -> str:
    """UTC ISO 8601 with milliseconds, `Z` suffix."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class AuditRecord:
    timestamp: str
    component: str
    type: str
    job: str | None = None
    cell: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    source_extra: dict[str, Any] = field(default_factory=dict)  # other ids (trainer rank, ...)

    def to_json(self) -> dict[str, Any]:
        source: dict[str, Any] = {"component": self.component}
        if self.job is not None:
            source["job"] = self.job
        if self.cell is not None:
            source["cell"] = self.cell
        source.update(self.source_extra)
        return {"timestamp": self.timestamp, "source": source, "type": self.type, **self.fields}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditRecord:
        raw_source = data.get("source", {})
        source = dict(raw_source) if isinstance(raw_source, dict) else {"component": str(raw_source)}
        component = str(source.pop("component", data.get("component", "unknown")))
        component = LEGACY_COMPONENTS.get(component, component)
        fields = {k: v for k, v in data.items() if k not in RESERVED and k != "component"}
        return cls(
            timestamp=str(data.get("timestamp", "")),
            component=component,
            type=str(data.get("type", "")),
            job=source.pop("job", None),
            cell=source.pop("cell", None),
            fields=fields,
            source_extra=source,
        )


class AuditLog:
    """Appends records to `<directory>/<component>.jsonl`; each line is flushed as written."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        job: str,
        component: str = INFERENCE_CONTROLLER,
        clock: Clock | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.job = job
        self.component = component
        self.clock = clock or RealClock()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{component}.jsonl"

    def record(self, type: str, cell: str | None = None, **fields: Any) -> AuditRecord:
        clash = RESERVED & fields.keys()
        if clash:
            raise ValueError(f"audit fields may not be named {sorted(clash)}")
        rec = AuditRecord(iso_ms(self.clock.now()), self.component, type, self.job, cell, dict(fields))
        line = json.dumps(rec.to_json(), sort_keys=False, default=str)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        return rec


def read_audit_log(path: str | os.PathLike[str]) -> list[AuditRecord]:
    """Every record of one JSONL file; a torn last line (a crash mid-write) is ignored."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records: list[AuditRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
        records.append(AuditRecord.from_json(data))
    return records
