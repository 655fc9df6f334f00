"""The audit log: JSONL per component, round-trip, and old `rollout_manager` logs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rljob_cli.audit import audit

from controller_runtime.audit import (
    INFERENCE_CONTROLLER,
    ROLLOUT_EXECUTOR,
    AuditLog,
    AuditWriter,
    read_audit_log,
    read_audit_stream,
)
from controller_runtime.clock import FakeClock

DATA = Path(__file__).parent / "data"


def test_records_round_trip(tmp_path: Path) -> None:
    clock = FakeClock(start=1_764_408_600.25)
    audit = AuditLog(tmp_path, job="demo", clock=clock)
    audit.record("cell_transition", "demo-cell-0", **{"from": "Starting"}, to="PendingWeights")
    audit.record("weights_updated", version="3", cells=["demo-cell-0"])
    assert audit.path == tmp_path / "inference_controller.jsonl"
    first = json.loads(audit.path.read_text().splitlines()[0])
    assert first["timestamp"] == "2025-11-29T09:30:00.250Z"
    assert first["source"] == {"component": INFERENCE_CONTROLLER, "job": "demo", "cell": "demo-cell-0"}
    records = read_audit_log(audit.path)
    assert [r.type for r in records] == ["cell_transition", "weights_updated"]
    assert records[0].fields == {"from": "Starting", "to": "PendingWeights"}
    assert records[1].cell is None and records[1].fields["cells"] == ["demo-cell-0"]


def test_each_component_writes_its_own_file(tmp_path: Path) -> None:
    AuditLog(tmp_path, "demo").record("x")
    AuditLog(tmp_path, "demo", component=ROLLOUT_EXECUTOR).record("y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inference_controller.jsonl", "rollout_executor.jsonl"]


def test_reserved_field_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="source"):
        AuditLog(tmp_path, "demo").record("x", source="y")


def test_old_rollout_manager_log_reads_as_rollout_executor() -> None:
    records = read_audit_log(DATA / "rollout_manager_legacy.jsonl")
    assert len(records) == 3  # blank line skipped, torn last line ignored
    assert {r.component for r in records} == {ROLLOUT_EXECUTOR}
    assert records[0].source_extra == {"trainer_rank": 0} and records[0].fields == {"rollout_id": 7}
    assert records[2].cell == "cell-1" and records[2].fields["count"] == 2


def test_corrupt_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"type": "a", "source": {"component": "c"}}\nnot json\n{"type": "b"}\n')
    with pytest.raises(ValueError, match=":2:"):
        read_audit_log(path)


KUBECTL_LOGS = [
    '2026-12-01T10:00:00.000000001Z {"time": "2026-12-01 10:00:00", "level": "INFO", "logger": "rljob_operator", "message": "listening"}',
    '2026-12-01T10:00:01.000000001Z {"timestamp": "2026-12-01T10:00:01.000Z", "source": {"component": "inference_controller", '
    '"job": "demo", "cell": "demo-cell-0", "namespace": "team-a"}, "type": "cell_transition", "from": "Pending", "to": "Starting"}',
    '{"timestamp": "2026-12-01T10:00:02.000Z", "source": {"component": "inference_controller", "job": "other", '
    '"namespace": "team-a"}, "type": "event", "reason": "CellCreated"}',
    "2026-12-01 10:00:03 INFO kopf.objects handler succeeded",
    '{"timestamp": "2026-12-01T10:00:04.000Z", "source": {"component": "inference_controller", "job": "demo", '
    '"namespace": "team-b"}, "type": "event", "reason": "CellCreated"}',
]


def test_operator_records_are_picked_out_of_kubectl_logs_output() -> None:
    records = read_audit_stream(KUBECTL_LOGS)
    assert [(r.job, r.type) for r in records] == [("demo", "cell_transition"), ("other", "event"), ("demo", "event")]
    assert records[0].source_extra == {"namespace": "team-a"} and records[0].fields == {"from": "Pending", "to": "Starting"}


def test_the_operator_writer_names_the_namespace_in_the_local_schema() -> None:
    lines: list[str] = []
    writer = AuditWriter("demo", lines.append, clock=FakeClock(start=1_764_408_600.25), source_extra={"namespace": "team-a"})
    writer.record("weights_updated", version="3")
    assert json.loads(lines[0]) == {"timestamp": "2025-11-29T09:30:00.250Z", "type": "weights_updated", "version": "3",
                                    "source": {"component": INFERENCE_CONTROLLER, "job": "demo", "namespace": "team-a"}}


def test_rljob_audit_prints_one_jobs_history_from_kubectl_logs(tmp_path: Path) -> None:
    out = io.StringIO()
    assert audit("demo", "-", namespace="team-a", out=out, stdin=io.StringIO("\n".join(KUBECTL_LOGS))) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "demo-cell-0" in lines[0] and 'to="Starting"' in lines[0]
    assert audit("nobody", "-", out=io.StringIO(), stdin=io.StringIO("\n".join(KUBECTL_LOGS))) == 1


def test_rljob_audit_reads_a_local_logs_dir_with_old_rollout_manager_records(tmp_path: Path) -> None:
    (tmp_path / "rollout_manager.jsonl").write_text((DATA / "rollout_manager_legacy.jsonl").read_text())
    AuditLog(tmp_path, "demo", clock=FakeClock(start=1_772_446_510.0)).record("weights_updated", version="3")
    out = io.StringIO()
    assert audit("demo", str(tmp_path), out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and all(ln.startswith("2026-03-02T10:1") for ln in lines)
    assert sum(ROLLOUT_EXECUTOR in ln for ln in lines) == 3 and "weights_updated" in lines[-1]
