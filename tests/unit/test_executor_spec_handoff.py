"""The operator hands the executor its part of the RLJob spec through the Deployment's env;
the executor must read back exactly the user's sampling, reward and batch settings."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml
from rljob_operator.manifests.executor import EXECUTOR_SPEC_ENV, executor_deployment
from rollout_executor.__main__ import default_data_host, load_manifest, parse_args

ROOT = Path(__file__).resolve().parents[2]
URL = "http://rljob-operator.rljob-system.svc:8080"


def _job(name: str = "llama-8b-8gpu") -> dict:
    job = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    job["metadata"].setdefault("namespace", "rl")
    job["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return job


def _env(deploy: dict) -> dict[str, str]:
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_executor_reads_the_users_rollout_spec_from_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job()
    job["spec"]["rollout"]["sampling"] = {"nSamplesPerPrompt": 4, "maxTokens": 321, "temperature": 0.7}
    job["spec"]["rollout"]["batchSize"] = 13
    job["spec"]["rollout"]["reward"] = {"function": "rollout_executor.rewards:regex_match", "args": {"pattern": "ok"}}
    env = _env(executor_deployment(job, URL))
    monkeypatch.setenv(EXECUTOR_SPEC_ENV, env[EXECUTOR_SPEC_ENV])
    manifest = load_manifest(argparse.Namespace(manifest=None, dataset=None))
    ro = manifest.spec.rollout
    assert (ro.sampling.n_samples_per_prompt, ro.sampling.max_tokens, ro.sampling.temperature) == (4, 321, 0.7)
    assert ro.batch_size == 13
    assert ro.reward.function == "rollout_executor.rewards:regex_match" and ro.reward.args == {"pattern": "ok"}
    assert manifest.spec.rollout.dataset.path == job["spec"]["rollout"]["dataset"]["path"]


def test_scaling_engines_does_not_change_the_executor_pod_template() -> None:
    job = _job()
    before = executor_deployment(job, URL)["spec"]["template"]
    job["spec"]["inference"]["replicas"] += 3
    assert executor_deployment(job, URL)["spec"]["template"] == before


def test_side_channel_binds_all_interfaces_when_the_actor_runs_in_another_ray_cluster() -> None:
    """With --ray-address (a KubeRay RayCluster) the actor runs on the cluster's node, where the
    executor pod's IP is not a local address: binding it there fails (seen with the real KubeRay)."""
    joined = parse_args(["--job", "j", "--node-ip", "10.50.0.7", "--ray-address", "ray://j-rollout:10001"])
    assert default_data_host(joined) == "0.0.0.0"
    own_head = parse_args(["--job", "j", "--node-ip", "10.50.0.7"])
    assert default_data_host(own_head) == "10.50.0.7"
    assert default_data_host(parse_args(["--job", "j", "--node-ip", "localhost"])) == "127.0.0.1"
