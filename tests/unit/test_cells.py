"""The cell state machine: legal and illegal transitions, recreation, status round-trip."""

from __future__ import annotations

import itertools

import pytest

from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import CellState, EngineStatus
from controller_runtime.cells import TRANSITIONS, Cell, IllegalTransition, cell_name, is_legal

S = CellState
NOW = 1_700_000_000.0


def test_happy_path_is_legal() -> None:
    cell = Cell("j-cell-0", 0)
    for target in (S.Starting, S.PendingWeights, S.Serving, S.Offloaded, S.Serving):
        assert cell.transition(target, NOW)
    assert cell.state == S.Serving


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (S.Pending, S.Serving),  # must load and take weights first
        (S.Pending, S.PendingWeights),
        (S.Serving, S.PendingWeights),
        (S.Serving, S.Starting),
        (S.Unhealthy, S.Serving),  # only a recreation leaves Unhealthy
        (S.Failed, S.Serving),
        (S.Offloaded, S.Starting),
    ],
)
def test_illegal_transitions_raise_a_typed_error(source: CellState, target: CellState) -> None:
    cell = Cell("j-cell-0", 0, state=source)
    with pytest.raises(IllegalTransition) as err:
        cell.transition(target, NOW)
    assert (err.value.source, err.value.target) == (source, target)
    assert cell.state == source


def test_every_live_state_can_become_unhealthy_and_failed() -> None:
    for state in (S.Pending, S.Starting, S.PendingWeights, S.Serving, S.Offloaded):
        assert is_legal(state, S.Unhealthy)
        assert is_legal(state, S.Failed)


def test_table_covers_every_state_and_never_loops_to_itself() -> None:
    assert set(TRANSITIONS) == set(CellState)
    for source, target in itertools.product(CellState, CellState):
        if source == target:
            assert not is_legal(source, target)


def test_same_state_is_not_a_transition() -> None:
    cell = Cell("j-cell-0", 0, state=S.Serving)
    assert cell.transition(S.Serving, NOW, "still serving") is False
    assert cell.message == "still serving"


def test_recreate_bumps_generation_and_resets_the_incarnation() -> None:
    cell = Cell("j-cell-0", 0, generation=2, state=S.Unhealthy, endpoint="http://x", weight_version="7",
                consecutive_failures=3, restarts=1, memory=(MemoryTag.kv_cache,))
    cell.recreate(NOW, charge=True)
    assert (cell.generation, cell.state, cell.restarts) == (3, S.Pending, 2)
    assert cell.endpoint is None and cell.weight_version is None and cell.memory == ()
    assert cell.consecutive_failures == 0 and cell.created_time == NOW
    cell.transition(S.Unhealthy, NOW)
    cell.recreate(NOW, charge=False)
    assert (cell.generation, cell.restarts) == (4, 2)


def test_recreate_of_a_serving_cell_is_illegal() -> None:
    with pytest.raises(IllegalTransition):
        Cell("j-cell-0", 0, state=S.Serving).recreate(NOW, charge=True)


def test_status_round_trip_keeps_everything_the_controller_needs() -> None:
    cell = Cell(
        "j-cell-1", 1, generation=3, state=S.Offloaded, pods=("p0", "p1"), endpoint="http://10:8000",
        memory=(MemoryTag.weights, MemoryTag.kv_cache), state_before_offload=S.Serving, weight_version="4",
        consecutive_failures=1, restarts=2, pod_restarts=5, last_probe_time=NOW, last_transition_time=NOW + 1,
        next_restart_time=NOW + 30, message="weights released",
    )
    wire = cell.to_status().to_wire()
    back = Cell.from_status(EngineStatus.model_validate(wire))
    assert wire["stateBeforeOffload"] == "Serving" and wire["podRestarts"] == 5
    for name in ("name", "index", "generation", "state", "pods", "endpoint", "memory", "state_before_offload",
                 "weight_version", "consecutive_failures", "restarts", "pod_restarts", "last_probe_time",
                 "last_transition_time", "next_restart_time", "message"):
        assert getattr(back, name) == getattr(cell, name), name


def test_cell_names_are_deterministic() -> None:
    assert cell_name("demo", 3) == "demo-cell-3"
