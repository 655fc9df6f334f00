"""`rljob audit JOB [SOURCE]`: a job's history from its audit records.

SOURCE is a local run's logs directory (its `*.jsonl` files), one JSONL file, the operator's
`--audit-log-file`, or saved `kubectl logs` output; `-` (the default) reads standard input,
so `kubectl -n rljob-system logs POD | rljob audit JOB` works as it is. Lines that are not
audit records (the operator's other log lines) are skipped, and old `rollout_manager`
records read as `rollout_executor`, as `controller_runtime.audit` reads them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from controller_runtime.audit import AuditRecord, read_audit_stream


def _lines(source: str, stdin: TextIO) -> Iterator[str]:
    if source == "-":
        yield from stdin
        return
    path = Path(source)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    for f in files:
        yield from f.read_text(encoding="utf-8").splitlines()


def select(records: Iterable[AuditRecord], job: str, namespace: str | None) -> list[AuditRecord]:
    """The job's records in time order (ISO timestamps sort as text).

    Records that name no job (old `rollout_manager` logs did not) belong to whichever job's
    logs they are in: a local run's directory holds one job.
    """
    mine = [
        r
        for r in records
        if r.job in (job, None)
        and (namespace is None or r.source_extra.get("namespace") in (None, namespace))
    ]
    return sorted(mine, key=lambda r: r.timestamp)


def format_record(r: AuditRecord) -> str:
    fields = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in r.fields.items())
    return f"{r.timestamp}  {r.component:<20} {r.cell or '-':<24} {r.type:<16} {fields}".rstrip()


def audit(
    job: str,
    source: str = "-",
    namespace: str | None = None,
    types: Iterable[str] = (),
    out: TextIO = sys.stdout,
    stdin: TextIO = sys.stdin,
) -> int:
    try:
        records = select(read_audit_stream(_lines(source, stdin)), job, namespace)
    except OSError as exc:
        print(f"rljob audit: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    wanted = set(types)
    shown = [r for r in records if not wanted or r.type in wanted]
    for r in shown:
        print(format_record(r), file=out)
    if not records:
        print(f"rljob audit: no audit records of job {job!r} in {source}", file=sys.stderr)
        return 1
    return 0
