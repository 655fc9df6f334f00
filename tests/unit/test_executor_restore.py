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


def test_a_replaced_executor_resumes_after_the_last_rollout_every_rank_took(dataset: Path, tmp_path: Path) -> None:
    """Issue 12: the executor pod is deleted mid-run; its successor must not hand out prompts again."""
    state_dir = tmp_path / "state"
    first = executor(dataset, state_dir)
    trained = [take(first, 0)]
    generated_ahead = take(first, 1)  # overlap: rollout 1's prompts taken, not yet fetched
    first.mark_fetched(0, 0, 2)
    assert load_state(str(state_dir)) is None  # rank 1 has not taken its shard: nothing is final yet
    first.mark_fetched(0, 1, 2)
    assert load_state(str(state_dir)) is not None

    second = executor(dataset, state_dir)  # the new pod
    assert second.load() == 0
    assert [p.index for p in second.rollouts[1].prompts] == generated_ahead  # regenerated, same prompts
    trained += [generated_ahead, take(second, 2)]
    assert trained == expected_order(dataset, 3)


def test_per_rollout_saves_keep_only_the_newest_files(dataset: Path, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    ex = executor(dataset, state_dir)
    for r in range(7):
        take(ex, r)
        ex.mark_fetched(r, 0, 1)
    assert sorted(p.name for p in state_dir.glob("rollout_*.json")) == [f"rollout_{r}.json" for r in (3, 4, 5, 6)]
    assert load_state(str(state_dir)).rollout_id == 6  # type: ignore[union-attr]


def test_an_unwritable_state_dir_costs_the_resumption_not_the_rollout(dataset: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ex = executor(dataset, blocker / "state")
    take(ex, 0)
    ex.mark_fetched(0, 0, 1)  # logs a warning, raises nothing
    assert ex.rollouts[0].fetched_ranks == {0}
