"""The trainer's expected checksums fail a window by tensor name, even with one cell and
without spec.checkWeights; engines that can say what they received are read that way."""

from __future__ import annotations

from pathlib import Path

import pytest
from rljob_client.controller_client import WeightUpdateWindow

from controller_runtime.api.control import EndUpdateRequest
from controller_runtime.api.status import CellState
from controller_runtime.clock import FakeClock
from controller_runtime.errors import WeightCheckMismatch
from controller_runtime.events import Reason
from controller_runtime.fakes import FakeEngine
from controller_runtime.weightcheck import collect_checksums
from tests.unit.test_controller import bring_up, harness
from tests.unit.test_trainer_loop import Rig, make_rig

SENT = {"embed.weight": "e1", "layer.0.q_proj.weight": "q1"}


def receiving(engine: FakeEngine, received: dict[str, str]) -> None:
    """Give a fake engine the vLLM client's `received_checksums` (what the extension kept)."""

    async def received_checksums() -> dict[str, str]:
        engine.calls.append("received_checksums")
        return dict(received)

    engine.received_checksums = received_checksums  # type: ignore[attr-defined]


async def test_collect_reads_received_checksums_where_the_engine_has_them() -> None:
    plain, extended = FakeEngine("http://0"), FakeEngine("http://1")
    receiving(extended, SENT)
    got = await collect_checksums({"c0": plain, "c1": extended}, FakeClock(), 5, received=True)
    assert got == {"c0": {"w": "init"}, "c1": SENT}
    assert await collect_checksums({"c1": extended}, FakeClock(), 5) == {"c1": {"w": "init"}}


async def test_a_tensor_the_one_engine_never_received_fails_the_window_by_name() -> None:
    h = harness(1)  # checkWeights off: the trainer's checksums alone ask for the check
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    receiving(h.engine(0), {"embed.weight": "e1"})
    with pytest.raises(WeightCheckMismatch) as err:
        await h.ctrl.end_update_weights(window.snapshot, "1", expected_checksums=SENT)
    assert err.value.mismatched == {"demo-cell-0": ["layer.0.q_proj.weight"]}
    assert h.ctrl.lock.current is None
    assert Reason.WeightCheckFailed in h.reasons()
    cell = h.ctrl.fleet.cells["demo-cell-0"]
    assert cell.state is not CellState.Serving and cell.generation == window.snapshot["demo-cell-0"] + 1


async def test_a_tensor_that_differs_names_the_cell_and_the_tensor() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    receiving(h.engine(0), SENT)
    receiving(h.engine(1), {**SENT, "embed.weight": "CORRUPT"})
    with pytest.raises(WeightCheckMismatch) as err:
        await h.ctrl.end_update_weights(window.snapshot, "1", expected_checksums=SENT)
    assert err.value.mismatched == {"demo-cell-1": ["embed.weight"]}


async def test_matching_received_checksums_serve_the_new_version() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    for i in range(2):
        receiving(h.engine(i), SENT)
    assert await h.ctrl.end_update_weights(window.snapshot, "1", expected_checksums=SENT) == [
        "demo-cell-0", "demo-cell-1"]
    assert all("received_checksums" in h.engine(i).calls for i in range(2))


def test_the_end_request_carries_the_checksums_on_the_wire() -> None:
    req = EndUpdateRequest(snapshot={"c": 1}, weight_version="2", expected_checksums=SENT)
    wire = req.to_wire()
    assert wire["expectedChecksums"] == SENT
    assert EndUpdateRequest.model_validate(wire).expected_checksums == SENT


class CheckedTransport:
    """Pushes nothing, but says which checksums the engines must have received: the first
    attempt claims a tensor the engines never got, later ones what they did get."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.attempts = 0

    async def stage(self, model: object, version: int) -> None:
        return None

    async def push(self, window: WeightUpdateWindow, version: int, model: object) -> None:
        self.attempts += 1
        for engine in window.engines:
            receiving(self.rig.engines(engine.endpoint), SENT)
            window.pushed.append(engine.cell)
        window.expected_checksums = {**SENT, "lm_head.weight": "h1"} if self.attempts == 1 else dict(SENT)

    async def close(self) -> None:
        return None


async def test_the_loop_retries_a_window_that_failed_its_check_on_the_recreated_cell(tmp_path: Path) -> None:
    async for rig in make_rig(tmp_path):
        rig.loop.transport = CheckedTransport(rig)
        assert await rig.loop.push(0) == 2
        assert rig.platform.generation_of("job-cell-0") == 1  # stopped after the failed check, recreated
        [status] = rig.controller.engine_statuses()
        assert (status.state, status.weight_version) == (CellState.Serving, "0")
