"""Eval-fleet pinning: load, verify the version everywhere, probe; skip with a reason otherwise."""

from __future__ import annotations

from controller_runtime.clock import FakeClock
from controller_runtime.evalpin import PIN_VIOLATION, UNHEALTHY, EvalFleet, pin_eval_fleet
from controller_runtime.fakes import FakeEngines

ENDPOINTS = ["http://eval-0", "http://eval-1"]


async def test_pinned_fleet_is_ok_and_every_engine_loaded_the_checkpoint() -> None:
    engines = FakeEngines()
    fleet = await pin_eval_fleet(ENDPOINTS, engines, "/ckpt/step-10", "10", clock=FakeClock())
    assert fleet.ok and fleet.skip_reason is None and fleet.pinned_version == "10"
    assert fleet.versions == {e: "10" for e in ENDPOINTS}
    assert all(engines.engines[e].checksums == {"w": "disk:/ckpt/step-10"} for e in ENDPOINTS)
    assert all(engines.engines[e].closed for e in ENDPOINTS)
    assert EvalFleet.from_dict(fleet.to_dict()) == fleet


async def test_engine_reporting_another_version_is_a_pin_violation() -> None:
    engines = FakeEngines()
    original = engines("http://eval-1").update_weights_from_disk

    async def loads_but_keeps_old_version(path: str, version: str | None = None) -> None:
        await original(path, None)
        engines.engines["http://eval-1"].weight_version = "9"

    engines.engines["http://eval-1"].update_weights_from_disk = loads_but_keeps_old_version  # type: ignore[method-assign]
    fleet = await pin_eval_fleet(ENDPOINTS, engines, "/ckpt/step-10", "10", clock=FakeClock())
    assert not fleet.ok and fleet.skip_reason == PIN_VIOLATION
    assert "http://eval-1 serves '9'" in fleet.message
    assert "health" not in engines.engines["http://eval-0"].calls  # no readiness probe on wrong weights


async def test_failed_readiness_probe_skips_as_unhealthy() -> None:
    engines = FakeEngines()
    engines("http://eval-0").healthy = False
    fleet = await pin_eval_fleet(ENDPOINTS, engines, "/ckpt", "1", clock=FakeClock())
    assert (fleet.ok, fleet.skip_reason) == (False, UNHEALTHY)
    assert "http://eval-0" in fleet.message


async def test_failed_load_skips_as_unhealthy() -> None:
    engines = FakeEngines()
    engines("http://eval-1").fail.add("update_weights_from_disk")
    fleet = await pin_eval_fleet(ENDPOINTS, engines, "/ckpt", "1", clock=FakeClock())
    assert fleet.skip_reason == UNHEALTHY and "loading the checkpoint failed" in fleet.message


async def test_empty_fleet_is_skipped() -> None:
    fleet = await pin_eval_fleet([], FakeEngines(), "/ckpt", "1", clock=FakeClock())
    assert fleet.skip_reason == UNHEALTHY
