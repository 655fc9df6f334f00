"""The trainer SDK's surface: call order, the gate around each publish, streamed versions, env and versions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from rljob_client import versions
from rljob_client.env import EnvError, read
from rljob_client.job import CallOrderError, Job
from rljob_client.weights.export import INDEX_FILE, iter_named_tensors, write_stream
from rljob_client.wire.trainbatch import TrainBatch
from safetensors.torch import load_file

ENV = {"RLJOB_NAME": "j", "RLJOB_NAMESPACE": "ns", "RLJOB_CONTROLLER_URL": "http://127.0.0.1:1",
       "RLJOB_ROLLOUT_ADDRESS": "ray://127.0.0.1:1", "RLJOB_STEPS": "2"}


class Controller:
    holder = "trainer-0"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def prepare_rollout(self, step: int) -> None:
        self.calls.append(f"prepare {step}")

    async def cells(self) -> Any:
        return SimpleNamespace(lock=None, serving_endpoints=["e"], engines=[], weight_version="0")

    @asynccontextmanager
    async def update_weights(self, holder: str, weight_version: str | None = None,
                             ready_timeout: float | None = None) -> AsyncIterator[Any]:
        self.calls.append(f"window v{weight_version}")
        yield SimpleNamespace(engines=[], pushed=[])

    async def close(self) -> None:
        self.calls.append("close")


class Rollouts:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def get(self, step: int, rank: int, world_size: int) -> TrainBatch:
        self.calls.append(f"get {step}")
        n = 4
        return TrainBatch(arrays={"tokens": np.zeros((n, 3), np.int32), "response_mask": np.ones((n, 3), np.uint8),
                                  "rewards": np.array([0, 1, 1, 1], np.float32),
                                  "weight_versions": np.full(n, step, np.int64)}, rollout_id=step)

    def begin_weight_update(self) -> None:
        self.calls.append("gate closed")

    def set_weight_version(self, version: int) -> None:
        self.calls.append(f"executor v{version}")

    def end_weight_update(self, version: int | None = None) -> None:
        self.calls.append(f"gate open v{version}")


def make_job(tmp_path: Path, **env: str) -> tuple[Job, list[str]]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    e = read(ENV | {"RLJOB_MODEL_PATH": str(model), "RLJOB_WEIGHTS_DIR": str(tmp_path / "w"),
                    "RLJOB_METRICS_FILE": str(tmp_path / "steps.jsonl")} | env)
    controller = Controller()
    return Job(e, controller, Rollouts(controller.calls)), controller.calls  # type: ignore[arg-type]


def test_each_publish_is_a_window_inside_the_gate_and_a_streamed_version(tmp_path: Path) -> None:
    job, calls = make_job(tmp_path)
    model = torch.nn.Linear(3, 2)
    for batch in job.batches():
        assert len(batch) == 4
        assert job.publish_weights(iter_named_tensors(model)) == job.step + 1  # type: ignore[operator]
        job.report({"loss": 0.5})
    assert calls == ["gate closed", "window v0", "executor v0", "gate open v0",
                     "prepare 0", "get 0", "gate closed", "window v1", "executor v1", "gate open v1",
                     "prepare 1", "get 1", "gate closed", "window v2", "executor v2", "gate open v2"]
    v2 = tmp_path / "w" / "j" / "v2"
    assert set(load_file(str(v2 / "model.safetensors"))) == {"weight", "bias"} and (v2 / "config.json").is_file()
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(x["step"], x["weight_version"], x["reward_mean"], x["loss"]) for x in lines] == [(0, 1, 0.75, 0.5),
                                                                                           (1, 2, 0.75, 0.5)]
    job.close()


def test_publish_before_the_first_batch_names_the_expected_call(tmp_path: Path) -> None:
    job, _ = make_job(tmp_path)
    with pytest.raises(CallOrderError, match=r"before the first batch: expected a batch from job.batches\(\)"):
        job.publish_weights(iter_named_tensors(torch.nn.Linear(1, 1)))


def test_a_skipped_publish_fails_at_the_next_batch_naming_publish_weights(tmp_path: Path) -> None:
    job, _ = make_job(tmp_path)
    batches = job.batches()
    next(batches)
    with pytest.raises(CallOrderError, match=r"step 0: expected job.publish_weights\(...\) before the next batch"):
        next(batches)


def test_a_second_publish_or_a_report_before_publishing_is_refused(tmp_path: Path) -> None:
    job, _ = make_job(tmp_path)
    next(job.batches())
    with pytest.raises(CallOrderError, match=r"report\(\) before job.publish_weights"):
        job.report({"loss": 1.0})
    job.publish_weights(iter_named_tensors(torch.nn.Linear(1, 1)))
    with pytest.raises(CallOrderError, match="called twice"):
        job.publish_weights(iter_named_tensors(torch.nn.Linear(1, 1)))


def test_the_stream_writes_one_bucket_at_a_time_and_reads_back_equal(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    model[1].weight = model[0].weight  # tied: written once
    out = write_stream(iter_named_tensors(model, None), tmp_path / "v1", None, bucket_bytes=16 * 16 * 4)
    index = json.loads((out / INDEX_FILE).read_text())["weight_map"]
    assert "1.weight" not in index and len(set(index.values())) == 2  # the weight fills one shard, the biases share one
    loaded: dict[str, torch.Tensor] = {}
    for shard in set(index.values()):
        loaded |= load_file(str(out / shard))
    for name, tensor in loaded.items():
        assert torch.equal(tensor, model.state_dict()[name])


def test_an_empty_or_repeated_stream_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="iterator was empty"):
        write_stream(iter([]), tmp_path / "v1", None, 1024)
    t = torch.zeros(2)
    with pytest.raises(ValueError, match="'a' was published twice"):
        write_stream(iter([("a", t), ("a", t)]), tmp_path / "v1", None, 1024)
    assert not (tmp_path / "v1").exists() and not list(tmp_path.iterdir())


def test_env_names_the_missing_or_bad_variable() -> None:
    with pytest.raises(EnvError, match="RLJOB_MODEL_PATH is not set"):
        read(ENV | {"RLJOB_WEIGHTS_DIR": "/w"})
    with pytest.raises(EnvError, match=r"RANK='x': not a valid int"):
        read(ENV | {"RLJOB_MODEL_PATH": "/m", "RLJOB_WEIGHTS_DIR": "/w", "RANK": "x"})
    with pytest.raises(EnvError, match=r"RANK=2 must be in \[0, WORLD_SIZE=2\)"):
        read(ENV | {"RLJOB_MODEL_PATH": "/m", "RLJOB_WEIGHTS_DIR": "/w", "RANK": "2", "WORLD_SIZE": "2"})


def test_a_version_mismatch_names_both_sides_and_what_to_install() -> None:
    ours, theirs = versions.Runtime("3.12.1", "2.52.0"), versions.Runtime("3.11.9", "2.51.1")
    with pytest.raises(versions.VersionMismatch) as e:
        versions.check(ours, theirs)
    text = str(e.value)
    assert "executor runs Python 3.11.9 with Ray 2.51.1" in text and "trainer runs Python 3.12.1 with Ray 2.52.0" in text
    assert "use Python 3.11" in text and "ray[client]==2.51.1" in text
    versions.check(versions.Runtime("3.11.2", "2.52.0"), versions.Runtime("3.11.9", "2.52.0"))  # patch level: fine
    ray_error = RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.51.1\n    Python: 3.11.9\n"
                             "This process on Ray Client was started with:\n    Ray: 2.52.0\n    Python: 3.12.1\n")
    rewritten = versions.from_ray_error(ray_error, ours)
    assert rewritten is not None and str(rewritten) == text
    assert versions.from_ray_error(RuntimeError("connection refused"), ours) is None
