"""Trainer checkpoints (rljob_client.trainer.checkpoint): bit-exact round trip, errors that name
the file, atomic saves, and the resume decision of a (re)started trainer."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from rljob_client.trainer import checkpoint as C
from rljob_client.trainer.checkpoint import Checkpoint, CheckpointError, CheckpointStore


class Tied(torch.nn.Module):
    """An embedding tied to the output layer, as small LMs have it, plus a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.hidden = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor([0.5]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(ids))) * self.scale)


def trained(seed: int = 0, steps: int = 2) -> tuple[Tied, torch.optim.Adam]:
    torch.manual_seed(seed)
    model = Tied()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(torch.tensor([[1, 2, 3]])).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def snapshot(model: Tied, opt: torch.optim.Adam, step: int, executor: dict | None = None) -> Checkpoint:
    return Checkpoint(step=step, weight_version=step, model=C.model_state(model), optimizer=C.optimizer_state(opt),
                      rng=C.capture_rng(), executor=executor)


def test_a_checkpoint_round_trips_bit_exact(tmp_path: Path) -> None:
    model, opt = trained()
    executor = {"rolloutId": 3, "datasetEpoch": 0, "datasetOffset": 32, "pending": []}
    store = CheckpointStore(tmp_path)
    store.save(snapshot(model, opt, 4, executor))

    got = store.load(4)
    assert got.step == 4 and got.weight_version == 4 and got.executor == executor
    fresh, fresh_opt = trained(seed=1, steps=1)
    fresh.load_state_dict(got.model, strict=True)
    fresh_opt.load_state_dict(got.optimizer)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b), name
    assert fresh.head.weight.data_ptr() == fresh.embed.weight.data_ptr(), "the tie survives the round trip"
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    for key, state in saved["state"].items():
        for k, v in state.items():
            assert torch.equal(v, loaded["state"][key][k]), (key, k)


def test_rng_states_come_back_exactly() -> None:
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    state = C.capture_rng()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    C.restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_the_snapshot_is_a_copy_of_one_moment(tmp_path: Path) -> None:
    model, opt = trained()
    snap = snapshot(model, opt, 2)
    before = snap.model["hidden.weight"].clone()
    with torch.no_grad():
        model.hidden.weight.add_(1.0)  # the next step goes on while the save runs
    CheckpointStore(tmp_path).save(snap)
    assert torch.equal(CheckpointStore(tmp_path).load(2).model["hidden.weight"], before)


@pytest.mark.parametrize("name", [C.MODEL_FILE, C.OPTIMIZER_FILE, C.RNG_FILE])
def test_a_corrupt_file_is_named(tmp_path: Path, name: str) -> None:
    model, opt = trained()
    store = CheckpointStore(tmp_path)
    path = store.save(snapshot(model, opt, 2)) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{path} is corrupt"):
        store.load(2)


@pytest.mark.parametrize("name", [C.MODEL_FILE, C.MANIFEST])
def test_a_missing_file_is_named(tmp_path: Path, name: str) -> None:
    model, opt = trained()
    store = CheckpointStore(tmp_path)
    path = store.save(snapshot(model, opt, 2)) / name
    path.unlink()
    with pytest.raises(CheckpointError, match=f"{path} is missing"):
        store.load(2)


def test_an_unreadable_manifest_is_named(tmp_path: Path) -> None:
    model, opt = trained()
    store = CheckpointStore(tmp_path)
    path = store.save(snapshot(model, opt, 2)) / C.MANIFEST
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{path} is unreadable"):
        store.resume_point()


def test_a_crash_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = trained()
    store = CheckpointStore(tmp_path)
    store.save(snapshot(model, opt, 2))

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # stands in for the process dying inside torch.save

    monkeypatch.setattr(C.torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        store.save(snapshot(model, opt, 4))
    monkeypatch.undo()
    assert store.steps() == [2]
    assert store.resume_point().step == 2


def test_a_process_killed_mid_save_leaves_a_temporary_that_resume_ignores(tmp_path: Path) -> None:
    """What SIGKILL leaves (no cleanup runs): a half-written `.tmp-` directory beside the checkpoints."""
    model, opt = trained()
    store = CheckpointStore(tmp_path)
    store.save(snapshot(model, opt, 2))
    half = tmp_path / ".tmp-step-4.abc"
    half.mkdir()
    (half / C.MODEL_FILE).write_bytes(b"\0" * 10)
    assert store.resume_point().step == 2
    store.save(snapshot(model, opt, 4))
    assert not half.exists(), "the next save removes the leftover"


def test_only_the_newest_checkpoints_stay_and_abandoned_later_ones_go(tmp_path: Path) -> None:
    model, opt = trained()
    store = CheckpointStore(tmp_path, keep=2)
    for step in (2, 4, 6, 8):
        store.save(snapshot(model, opt, step))
    assert store.steps() == [6, 8]
    store.save(snapshot(model, opt, 6))  # a run resumed from 6 saves 6 again: 8 belongs to the abandoned run
    assert store.steps() == [6]
    assert store.resume_point().step == 6


def test_a_first_start_with_an_empty_or_absent_dir_starts_fresh(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "absent").resume_point() is None
    (tmp_path / "empty").mkdir()
    assert CheckpointStore(tmp_path / "empty").resume_point() is None


def test_resume_requested_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"resume requested but checkpoint directory {tmp_path} holds no checkpoint"):
        CheckpointStore(tmp_path).resume_point(required=True)


def test_a_non_empty_dir_without_a_usable_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"holds 'weights\.bin', which is not a checkpoint"):
        CheckpointStore(tmp_path).resume_point()
    (tmp_path / "weights.bin").unlink()
    (tmp_path / "step-3").mkdir()  # a checkpoint directory without its manifest
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'step-3' / C.MANIFEST} is missing"):
        CheckpointStore(tmp_path).resume_point()


def test_the_newest_checkpoint_broken_is_refused_not_skipped(tmp_path: Path) -> None:
    model, opt = trained()
    store = CheckpointStore(tmp_path, keep=3)
    store.save(snapshot(model, opt, 2))
    (store.save(snapshot(model, opt, 4)) / C.OPTIMIZER_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"step-4/optimizer\.pt is missing"):
        store.resume_point()


@pytest.mark.parametrize("case", ["corrupt", "resume-without-checkpoint"])
def test_the_trainer_refuses_to_start_over_a_bad_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture, case: str) -> None:
    """`python -m rljob_client.trainer` exits 2 naming the file before it loads a model or trains a step."""
    from rljob_client.trainer import __main__ as trainer_main

    monkeypatch.setenv("RLJOB_CONTROLLER_URL", "http://127.0.0.1:9")  # never called: the refusal comes first
    monkeypatch.setenv("RLJOB_NAME", "job")
    ckpt_dir = tmp_path / "weights" / "job" / "checkpoints"
    argv = ["--model", str(tmp_path / "no-model"), "--weights-dir", str(tmp_path / "weights"), "--save-every", "2"]
    if case == "corrupt":
        model, opt = trained()
        bad = CheckpointStore(ckpt_dir).save(snapshot(model, opt, 2)) / C.RNG_FILE
        bad.write_text("{}")
        expected = f"{bad} is corrupt"
    else:
        argv.append("--resume")
        expected = f"resume requested but checkpoint directory {ckpt_dir} holds no checkpoint"
    assert trainer_main.main(argv) == trainer_main.EXIT_BAD_CHECKPOINT
    assert expected in caplog.text
