"""The executor's side of a trainer checkpoint: the state after a rollout (position and pending
rollouts) and the restore a resumed trainer asks for. No engines: generation never starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rollout_executor.config import EngineSource, ExecutorConfig
from rollout_executor.dataset import Position, PromptDataset
from rollout_executor.executor import Rollout, RolloutExecutor
from rollout_executor.state import ExecutorState, PendingRollout, StateError, load_state, save_state

N_ROWS, BATCH = 10, 4


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(N_ROWS)))
    return path


def executor(dataset: Path, state_dir: Path | None = None) -> RolloutExecutor:
    cfg = ExecutorConfig(job="t", dataset_path=str(dataset), model="m", label_field=None, batch_size=BATCH,
                         reward_function="rollout_executor.rewards:token_set_fraction", state_dir=str(state_dir) if state_dir else None,
                         engines=EngineSource(endpoints=("http://127.0.0.1:1",)))
    return RolloutExecutor(cfg)


def take(ex: RolloutExecutor, rollout_id: int) -> list[int]:
    """What `_ensure` does on first sight of a rollout, without starting generation."""
    start = ex.dataset.position
    prompts = ex.dataset.take(BATCH)
    ex.rollouts[rollout_id] = Rollout(rollout_id, prompts, start, ex.dataset.position)
    return [p.index for p in prompts]


def expected_order(dataset: Path, rollouts: int) -> list[list[int]]:
    ds = PromptDataset.from_path(str(dataset), label_field=None)
    return [[p.index for p in ds.take(BATCH)] for _ in range(rollouts)]


def test_read_names_the_same_prompts_as_take_without_moving(dataset: Path) -> None:
    ds = PromptDataset.from_path(str(dataset), label_field=None)
    prompts, end = ds.read(Position(0, 8), 4)  # crosses into epoch 1
    assert ds.position == Position()
    ds.seek(Position(0, 8))
    assert [p.index for p in ds.take(4)] == [p.index for p in prompts] and ds.position == end == Position(1, 2)


def test_the_state_after_a_rollout_lists_the_rollouts_taken_beyond_it(dataset: Path) -> None:
    ex = executor(dataset)
    for r in range(4):
        take(ex, r)
    ex.set_weight_version(2)
    state = ex.state_after(1)
    assert (state.rollout_id, state.dataset_epoch, state.dataset_offset, state.weight_version) == (1, 0, 8, 2)
    assert state.pending == (PendingRollout(2, 0, 8, BATCH), PendingRollout(3, 1, 2, BATCH))


def test_restore_gives_pending_and_later_rollouts_the_same_prompts(dataset: Path) -> None:
    """A trainer that died after step 3 resumes from its checkpoint after step 1: rollouts 2.. again, same prompts."""
    order = expected_order(dataset, 6)
    ex = executor(dataset)
    take(ex, 0)
    take(ex, 1)
    take(ex, 2)  # generated ahead (overlap) when the checkpoint was taken
    saved = ex.checkpoint(1)
    take(ex, 3)
    ex.set_weight_version(4)  # the dead trainer's lineage went on

    assert ex.restore({**saved, "weight_version": 2}) == 1
    assert ex.versions.current == 2, "the version goes back to the checkpoint's"
    assert sorted(ex.rollouts) == [2] and [p.index for p in ex.rollouts[2].prompts] == order[2]
    assert take(ex, 3) == order[3] and take(ex, 4) == order[4]


def test_restore_is_saved_for_a_restarting_executor_too(dataset: Path, tmp_path: Path) -> None:
    ex = executor(dataset, tmp_path / "state")
    take(ex, 0)
    state = ex.checkpoint(0)
    take(ex, 1)
    ex.restore(state)
    again = executor(dataset, tmp_path / "state")
    assert again.load() == 0 and again.dataset.position == Position(0, BATCH)


def test_a_state_without_pending_rollouts_still_loads(tmp_path: Path) -> None:
    """Files written before pending rollouts were recorded."""
    (tmp_path / "rollout_3.json").write_text(json.dumps({"rollout_id": 3, "dataset_epoch": 0, "dataset_offset": 4,
                                                         "weight_version": 3, "job": "t", "format": 1}))
    (tmp_path / "latest.json").write_text(json.dumps({"file": "rollout_3.json"}))
    assert load_state(str(tmp_path)) == ExecutorState(3, 0, 4, 3, "t")


def test_a_state_round_trips_with_its_pending_rollouts(tmp_path: Path) -> None:
    state = ExecutorState(5, 1, 2, 6, "t", pending=(PendingRollout(6, 1, 2, 4),))
    save_state(str(tmp_path), state)
    assert load_state(str(tmp_path)) == state == ExecutorState.from_dict(state.to_dict())


def test_a_foreign_state_is_refused_naming_its_source(tmp_path: Path) -> None:
    (tmp_path / "rollout_1.json").write_text(json.dumps({"format": 9}))
    (tmp_path / "latest.json").write_text(json.dumps({"file": "rollout_1.json"}))
    with pytest.raises(StateError, match=r"rollout_1\.json has format 9, expected 1"):
        load_state(str(tmp_path))
