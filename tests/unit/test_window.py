"""Window membership: snapshot, engines sorted with GPU offsets, who serves and who stops."""

from __future__ import annotations

import json

from controller_runtime.api.status import CellState
from controller_runtime.cells import Cell
from controller_runtime.clock import FakeClock
from controller_runtime.lock import WindowLock
from controller_runtime.window import (
    UpdateWindow,
    cells_to_serve,
    cells_to_stop,
    take_snapshot,
    window_engines,
)

S = CellState


def fleet() -> list[Cell]:
    return [
        Cell("j-cell-2", 2, generation=0, state=S.Serving, endpoint="http://c2"),
        Cell("j-cell-0", 0, generation=1, state=S.PendingWeights, endpoint="http://c0"),
        Cell("j-cell-1", 1, generation=0, state=S.Starting, endpoint="http://c1"),
        Cell("j-cell-3", 3, generation=2, state=S.Unhealthy, endpoint="http://c3"),
    ]


def test_snapshot_names_pending_weights_and_serving_cells_with_generations() -> None:
    assert take_snapshot(fleet()) == {"j-cell-2": 0, "j-cell-0": 1}


def test_engines_are_sorted_by_index_with_gpu_offsets() -> None:
    cells = fleet()
    engines = window_engines(cells, take_snapshot(cells), gpus_per_engine=4)
    assert [(e.name, e.gpu_count, e.gpu_offset) for e in engines] == [("j-cell-0", 4, 0), ("j-cell-2", 4, 8)]


def test_recreated_cell_is_neither_served_nor_stopped() -> None:
    cells = fleet()
    snapshot = take_snapshot(cells)
    cells[1].generation = 2  # j-cell-0 recreated while the window was open
    cells[1].state = S.PendingWeights
    assert [c.name for c in cells_to_serve(cells, snapshot)] == ["j-cell-2"]
    assert [c.name for c in cells_to_stop(cells, snapshot)] == ["j-cell-2"]


def test_update_window_round_trips_through_json() -> None:
    cells = fleet()
    snapshot = take_snapshot(cells)
    now = FakeClock().now()
    window = UpdateWindow(window_engines(cells, snapshot, 1), snapshot,
                          WindowLock("t", now, now + 60, snapshot).to_status())
    data = json.loads(json.dumps(window.to_dict()))
    assert data["engines"][0]["gpuOffset"] == 0 and data["lock"]["holder"] == "t"
    assert UpdateWindow.from_dict(data) == window
