"""The audit log: one JSONL record per controller (or executor) event, one file per component.

Record shape (one line): `{"timestamp": "2026-11-29T09:30:00.123Z", "source": {"component":
"inference_controller", "job": "demo", "cell": "demo-cell-0"}, "type": "cell_transition",
...fields}`. Files are `<component>.jsonl` in a directory (`inference_controller.jsonl`,
`rollout_executor.jsonl`). In cluster mode the operator writes the same records, one per
line, to its log stream under the logger `rljob.audit` (and to `--audit-log-file` if set), with
the namespace in `source`; `read_audit_stream` picks them out of `kubectl logs` output.

miles called the executor `rollout_manager` before the split; `read_audit_log` keeps reading
such logs and reports their component as `rollout_executor`, so tools written against the
new name work on old runs without a migration step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
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


class AuditWriter:
    """Formats one record per call and hands its JSON line to `write`.

    Local mode writes the lines to a file per component (`AuditLog`); the operator writes them
    to its log stream under one logger name (and optionally a file), so `kubectl logs` carries
    the same records that local mode's files do.
    """

    def __init__(
        self,
        job: str,
        write: Callable[[str], None],
        component: str = INFERENCE_CONTROLLER,
        clock: Clock | None = None,
        source_extra: dict[str, Any] | None = None,
    ) -> None:
        self.job = job
        self.component = component
        self.clock = clock or RealClock()
        self.source_extra = dict(source_extra or {})
        self._write = write

    def record(self, type: str, cell: str | None = None, **fields: Any) -> AuditRecord:
        clash = RESERVED & fields.keys()
        if clash:
            raise ValueError(f"audit fields may not be named {sorted(clash)}")
        rec = AuditRecord(
            iso_ms(self.clock.now()), self.component, type, self.job, cell, dict(fields), dict(self.source_extra)
        )
        self._write(json.dumps(rec.to_json(), sort_keys=False, default=str))
        return rec


class AuditLog(AuditWriter):
    """Appends records to `<directory>/<component>.jsonl`; each line is flushed as written."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        job: str,
        component: str = INFERENCE_CONTROLLER,
        clock: Clock | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{component}.jsonl"
        super().__init__(job, self._append, component, clock)

    def _append(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def record_in_line(line: str) -> AuditRecord | None:
    """The audit record a log line carries, or None for any other line.

    Reads `kubectl logs` output: other loggers' lines (JSON or text) are skipped, and so is a
    `--timestamps` prefix before the record's `{`.
    """
    start = line.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(line[start:])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not {"timestamp", "source", "type"} <= data.keys():
        return None
    return AuditRecord.from_json(data)


def read_audit_stream(lines: Iterable[str]) -> list[AuditRecord]:
    """Every audit record among a log stream's lines (the operator's log, `kubectl logs`)."""
    return [rec for line in lines if (rec := record_in_line(line)) is not None]


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
