"""Overlap of generation and training (issue 10): the writer starts rollout n+1 before it trains on n.

Against the real controller on the fakes (the rig of test_trainer_loop): the order of the
control calls with overlap, and the default the spec implies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from rljob_client.trainer.loop import LoopConfig, default_overlap

from controller_runtime.api.spec import RLJobSpec
from tests.unit.test_trainer_loop import TINY_CPU, Rig, Rollouts, eventually, make_rig

on_loop = pytest.mark.asyncio(loop_scope="session")


class OverlappingRollouts(Rollouts):
    async def generate(self, rollout_id: int) -> None:
        self.journal.calls.append(f"generate {rollout_id}")


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(tmp_path):
        r.rollouts = OverlappingRollouts(r.journal, r.controller)
        r.loop.rollouts = r.rollouts
        r.loop.config = replace(r.loop.config, overlap=True, steps=3)
        yield r


@on_loop
async def test_with_overlap_the_writer_starts_the_next_rollout_before_it_trains(rig: Rig) -> None:
    await eventually(lambda: bool(rig.controller.serving_endpoints()))
    records = await rig.loop.run()
    window = ["start_update_weights", "end_update_weights v{v}", "set_weight_version {v}"]

    def sync(v: int) -> list[str]:
        return [c.format(v=v) for c in window]

    assert rig.journal.calls == [
        *sync(0),
        "prepare_rollout", "get", "prepare_rollout", "generate 1", "train", *sync(1),
        "get", "prepare_rollout", "generate 2", "train", *sync(2),
        "get", "train", *sync(3),  # the last step starts no rollout beyond the job's steps
    ]
    assert [r.weight_version for r in records] == [1, 2, 3]
    assert rig.rollouts.gate == ["begin", "end 0", "begin", "end 1", "begin", "end 2", "begin", "end 3"]


@on_loop
async def test_overlap_needs_a_source_that_can_generate(rig: Rig) -> None:
    rig.loop.rollouts = Rollouts(rig.journal, rig.controller)  # no generate()
    await eventually(lambda: bool(rig.controller.serving_endpoints()))
    with pytest.raises(TypeError, match="generate"):
        await rig.loop.run()


def spec(**rollout: object) -> RLJobSpec:
    data = yaml.safe_load(TINY_CPU.read_text())["spec"]
    data["rollout"].update(rollout)
    return RLJobSpec.model_validate(data)


def test_overlap_is_the_default_when_samples_may_be_a_version_behind(tmp_path: Path) -> None:
    assert default_overlap(spec()) and LoopConfig.from_spec(spec(), sync_dir=tmp_path).overlap
    assert not default_overlap(spec(maxStaleness=0))  # every early sample would be dropped as stale
    assert not LoopConfig.from_spec(spec(), sync_dir=tmp_path, overlap=False).overlap


def test_colocated_engines_do_not_overlap(tmp_path: Path) -> None:
    s = spec()
    s = s.model_copy(update={
        "trainer": s.trainer.model_copy(update={"colocate": True}),
        "inference": s.inference.model_copy(update={"offload": s.inference.offload.model_copy(update={"enabled": True})}),
    })
    assert not default_overlap(s)
