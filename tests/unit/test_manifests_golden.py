"""Golden files: every manifest builder rendered for representative RLJobs.

A change to a builder shows up as a readable YAML diff in review. Regenerate after an
intended change with `UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_manifests_golden.py`
and read the diff before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_operator.manifests import (
    PolicyPeers,
    cells_headless_service,
    engine_pods,
    engines_service,
    executor_deployment,
    executor_service,
    network_policies,
    ray_auth_secret,
    ray_cluster,
    trainer_workload,
)

from controller_runtime.ports import CellRequest

GOLDEN = Path(__file__).parent / "golden"
JOBS = GOLDEN / "jobs"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONTROLLER_URL = "http://rljob-operator.rljob-system.svc:8443"
# The two shipped examples, a multi-node cell (16 GPUs per engine, 8 per node), SGLang with offload,
# pod templates on every role (spec.<role>.template over the shorthand fields), and a model from the hub.
CASES = ["tiny-cpu", "llama-8b-8gpu", "multinode-vllm", "sglang-offload", "pod-templates", "qwen-7b-hf"]
# The operator in rljob-system and a Prometheus in monitoring, as the chart passes them.
PEERS = PolicyPeers("rljob-system", "monitoring", {"app.kubernetes.io/name": "prometheus"})


def load_job(case: str) -> dict[str, Any]:
    """examples/<case>.yaml if it is a shipped example, else golden/jobs/<case>.yaml.

    Examples carry no namespace or uid (the API server assigns the uid); fixed ones stand in.
    """
    path = EXAMPLES / f"{case}.yaml"
    if not path.exists():
        path = JOBS / f"{case}.yaml"
    job = yaml.safe_load(path.read_text())
    meta = job.setdefault("metadata", {})
    meta.setdefault("namespace", "examples")
    meta.setdefault("uid", "00000000-0000-4000-8000-00000000e0e0")
    return job


def render_all(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object of the job, in a fixed order: cell 0 at generation 1 stands for all cells."""
    name = job["metadata"]["name"]
    cell = CellRequest(name=f"{name}-cell-0", index=0, generation=1)
    docs = [ray_auth_secret(job, "golden-token"), cells_headless_service(job), engines_service(job)]
    docs += engine_pods(job, cell)
    docs += [executor_deployment(job, CONTROLLER_URL), executor_service(job)]
    docs += trainer_workload(job, CONTROLLER_URL)
    rc = ray_cluster(job)
    if rc is not None:
        docs.append(rc)
    return docs + network_policies(job, PEERS)


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a shared sub-dict out in full each time: anchors would hide what each object holds."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_NoAliasDumper, sort_keys=True, default_flow_style=False, width=120)


@pytest.mark.parametrize("case", CASES)
def test_manifests_match_golden_file(case: str) -> None:
    rendered = dump(render_all(load_job(case)))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert rendered == path.read_text(), (
        f"{path.name} differs: rerun with UPDATE_GOLDEN=1 if the change is intended"
    )


@pytest.mark.parametrize("case", CASES)
def test_rendering_is_deterministic(case: str) -> None:
    assert dump(render_all(load_job(case))) == dump(render_all(load_job(case)))
