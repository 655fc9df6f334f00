"""Prompt dataset: deterministic per-epoch shuffling, resume from a saved position, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rollout_executor.dataset import DatasetError, Position, PromptDataset, read_records


def write_jsonl(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "label": str(i)}) + "\n" for i in range(n)))
    return path


def indices(prompts: list) -> list[int]:
    return [p.index for p in prompts]


def test_same_seed_gives_same_order_and_epochs_differ(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", 10)
    a = PromptDataset.from_path(str(path), seed=3)
    b = PromptDataset.from_path(str(path), seed=3)
    first = indices(a.take(10))
    assert first == indices(b.take(10))
    assert sorted(first) == list(range(10))
    second = indices(a.take(10))
    assert sorted(second) == list(range(10))
    assert first != second, "each epoch is reshuffled"
    c = PromptDataset.from_path(str(path), seed=4)
    assert indices(c.take(10)) != first


def test_take_crosses_epoch_boundary(tmp_path: Path) -> None:
    ds = PromptDataset.from_path(str(write_jsonl(tmp_path / "d.jsonl", 5)), shuffle=False)
    assert indices(ds.take(3)) == [0, 1, 2]
    assert indices(ds.take(4)) == [3, 4, 0, 1]
    assert ds.position == Position(epoch=1, offset=2)


def test_resume_from_saved_position_continues_the_same_sequence(tmp_path: Path) -> None:
    path = str(write_jsonl(tmp_path / "d.jsonl", 7))
    straight = PromptDataset.from_path(path, seed=11)
    expected = indices(straight.take(4)) + indices(straight.take(9))
    first = PromptDataset.from_path(path, seed=11)
    got = indices(first.take(4))
    saved = Position.from_dict(json.loads(json.dumps(first.position.to_dict())))
    restarted = PromptDataset.from_path(path, seed=11)
    restarted.seek(saved)
    got += indices(restarted.take(9))
    assert got == expected


def test_missing_path_names_the_spec_field(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"spec\.rollout\.dataset\.path .*does not exist"):
        PromptDataset.from_path(str(tmp_path / "nope.jsonl"))


def test_missing_prompt_field_is_reported(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "x"}\n')
    with pytest.raises(DatasetError, match="promptField 'prompt'"):
        PromptDataset.from_path(str(p))


def test_parquet_reads_like_jsonl(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": f"q{i}", "label": str(i)} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert read_records(str(tmp_path / "d.parquet")) == rows
    ds = PromptDataset.from_path(str(tmp_path / "d.parquet"), shuffle=False)
    assert [(p.text, p.label) for p in ds.take(2)] == [("q0", "0"), ("q1", "1")]


def test_seek_outside_the_dataset_is_refused(tmp_path: Path) -> None:
    ds = PromptDataset.from_path(str(write_jsonl(tmp_path / "d.jsonl", 3)))
    with pytest.raises(DatasetError):
        ds.seek(Position(0, 4))
