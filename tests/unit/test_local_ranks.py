"""Local mode's trainer ranks (issue 10): the 2-rank example is tiny-cpu.yaml with two ranks, and each
rank writes its own log, metrics and batches files (rank 0 keeps the one-rank names)."""

from __future__ import annotations

from pathlib import Path

import yaml
from rljob_cli.capacity import GIB, local_mode_problems
from rljob_cli.run import rank_argv, rank_path

from controller_runtime.api import RLJobManifest
from tests.unit.crd_cases import REPO_ROOT


def load(name: str) -> RLJobManifest:
    return RLJobManifest.model_validate(yaml.safe_load((REPO_ROOT / "examples" / name).read_text()))


def test_the_two_rank_example_is_the_toy_job_with_two_ranks() -> None:
    one, two = load("tiny-cpu.yaml").spec, load("tiny-cpu-2ranks.yaml").spec
    assert (one.trainer.replicas, two.trainer.replicas) == (1, 2)
    assert two.model_copy(update={"trainer": one.trainer}) == one, "only the rank count differs: curves compare per sample"
    assert two.rollout.max_staleness >= 1, "overlap is the default"
    assert local_mode_problems(two, 12 * GIB) == []


def test_each_rank_has_its_own_files() -> None:
    argv = ["python", "-m", "rljob_client.trainer", "--metrics-file", "/o/trainer-steps.jsonl",
            "--batches-file", "/o/trainer-batches.jsonl", "--steps", "3"]
    assert rank_argv(argv, 1) == ["python", "-m", "rljob_client.trainer", "--metrics-file",
                                  "/o/trainer-steps-rank1.jsonl", "--batches-file", "/o/trainer-batches-rank1.jsonl",
                                  "--steps", "3"]
    assert rank_path(Path("/o/logs/trainer.log"), 0) == Path("/o/logs/trainer.log")
    assert rank_path(Path("/o/logs/trainer.log"), 1) == Path("/o/logs/trainer-rank1.log")
