"""Disk weight sync files: a complete model dir per version, atomic, only the newest kept."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rljob_client.weights.disk import DiskWeightWriter
from safetensors.torch import load_file


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(4, 3)
        self.head = torch.nn.Linear(3, 4, bias=False)
        self.head.weight = self.embed.weight


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    (src / "tokenizer.json").write_text("{}")
    return src


def test_each_version_is_a_model_dir_with_weights_in_the_served_dtype(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    writer = DiskWeightWriter(tmp_path / "sync", _source(tmp_path))
    path = writer.save(model, 1)
    assert path == (tmp_path / "sync" / "v1").resolve()
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    tensors = load_file(str(path / "model.safetensors"))
    assert set(tensors) == {"weight", "bias"}
    assert tensors["weight"].dtype == torch.bfloat16
    assert torch.allclose(tensors["weight"].float(), model.weight.detach().to(torch.bfloat16).float())


def test_only_the_newest_versions_are_kept(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    writer = DiskWeightWriter(tmp_path / "sync", _source(tmp_path), keep=2)
    for v in range(1, 5):
        writer.save(model, v)
    assert writer.versions() == [3, 4]
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v3", "v4"]


def test_shared_tensors_are_written_once(tmp_path: Path) -> None:
    writer = DiskWeightWriter(tmp_path / "sync", _source(tmp_path), dtype=None)
    tensors = load_file(str(writer.save(Tied(), 1) / "model.safetensors"))
    assert list(tensors) == ["embed.weight"]
    assert tensors["embed.weight"].dtype == torch.float32


def test_leftovers_of_an_earlier_run_never_outlive_the_version_just_written(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    writer = DiskWeightWriter(tmp_path / "sync", _source(tmp_path), keep=2)
    for v in (29, 30):
        writer.save(model, v)
    writer.save(model, 0)  # a second run starts over
    assert writer.versions() == [0]
    writer.save(model, 1)
    assert writer.versions() == [0, 1]


def test_the_sent_tensors_are_a_snapshot_never_the_models_memory_cast_or_not() -> None:
    from rljob_client.weights.disk import unique_state_dict

    model = torch.nn.Linear(3, 2)
    for dtype in (torch.bfloat16, torch.float32, None):
        snap = unique_state_dict(model, dtype)
        assert snap["weight"].untyped_storage().data_ptr() != model.weight.untyped_storage().data_ptr()
        expected = model.weight.detach().to(dtype or model.weight.dtype).clone()
        assert torch.equal(snap["weight"], expected)
        with torch.no_grad():
            model.weight.add_(1.0)  # the optimizer's next step must not reach what is being sent
        assert torch.equal(snap["weight"], expected)
