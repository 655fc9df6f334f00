"""The audit log: JSONL per component, round-trip, and old `rollout_manager` logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller_runtime.audit import INFERENCE_CONTROLLER, ROLLOUT_EXECUTOR, AuditLog, read_audit_log
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
