"""Every manifest in examples/ parses with the pydantic models and passes the CRD's CEL rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rljob_operator.celcheck import CelChecker
from rljob_operator.crdgen import open_api_schema

from controller_runtime.api import RLJobManifest
from tests.unit.crd_cases import EXAMPLES, REPO_ROOT


@pytest.fixture(scope="module")
def checker() -> CelChecker:
    return CelChecker(open_api_schema())


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"tiny-cpu.yaml", "llama-8b-8gpu.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses_and_passes_cel(path: Path, checker: CelChecker) -> None:
    manifest = yaml.safe_load(path.read_text())
    job = RLJobManifest.model_validate(manifest)
    assert job.metadata.get("name")
    assert checker.violations(manifest) == []
    assert checker.violations(manifest, manifest) == [], "re-applying the same manifest is an allowed update"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_commented(path: Path) -> None:
    assert path.read_text().startswith("#"), "each example says what it shows in a header comment"


def test_tiny_cpu_is_the_documented_toy_task() -> None:
    job = RLJobManifest.model_validate(yaml.safe_load((REPO_ROOT / "examples/tiny-cpu.yaml").read_text())).spec
    assert (job.inference.engine, job.inference.replicas, job.inference.gpus_per_engine) == ("vllm", 1, 0)
    assert job.rollout.reward.function == "rollout_executor.rewards:token_set_fraction"
    assert job.rollout.reward.args == {"size": 100, "seed": 0}
    assert (job.rollout.batch_size, job.rollout.sampling.n_samples_per_prompt) == (8, 8)
    assert (job.rollout.sampling.temperature, job.rollout.sampling.max_tokens) == (1.0, 16)
    ref = job.trainer.reference
    assert (ref.algorithm, ref.learning_rate, ref.steps, job.rollout.max_staleness) == ("grpo", 3e-3, 30, 1)
    assert job.trainer.uses_reference_trainer and job.trainer.gpus_per_replica == 0
    dataset = REPO_ROOT / job.rollout.dataset.path
    prompts = [yaml.safe_load(line)["prompt"] for line in dataset.read_text().splitlines()]
    assert len(prompts) >= job.rollout.batch_size * 4 and all(prompts)


def test_llama_example_shape() -> None:
    job = RLJobManifest.model_validate(yaml.safe_load((REPO_ROOT / "examples/llama-8b-8gpu.yaml").read_text())).spec
    inf = job.inference
    assert (inf.replicas, inf.gpus_per_engine, inf.gpus_per_node, inf.tensor_parallel_size) == (4, 2, 8, 2)
    assert inf.pods_per_cell == 1
    assert "nvidia.com/gpu.product" in inf.placement.node_selector
    assert any(t.key == "nvidia.com/gpu" and t.operator == "Exists" and t.effect == "NoSchedule" for t in inf.placement.tolerations)
    assert not inf.offload.enabled
    assert inf.weight_update.method == "disk" and inf.weight_update.pvc is not None
    assert job.rollout.dataset.pvc is not None
    assert (job.trainer.replicas, job.trainer.gpus_per_replica) == (1, 8) and job.trainer.service_account_name


def test_llama_fsdp2_example_shards_the_model_over_eight_one_gpu_ranks() -> None:
    job = RLJobManifest.model_validate(yaml.safe_load((REPO_ROOT / "examples/llama-8b-fsdp2.yaml").read_text())).spec
    assert (job.trainer.replicas, job.trainer.gpus_per_replica) == (8, 1)
    assert job.trainer.command == ["python", "/opt/trainers/fsdp2.py"]
    assert {e.name: e.value for e in job.trainer.env}["MICRO_BATCHES"] == "4"
    assert job.rollout.batch_size * job.rollout.sampling.n_samples_per_prompt % (8 * 4) == 0  # whole micro-batches
