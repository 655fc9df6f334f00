"""Every pod the operator builds from a job with templates on every role, created (dry run) by a real API server.

The merge (`rljob_operator.manifests.template`) must give pods, a Deployment and a Job the
Pod API accepts as they are: no duplicate volume or container, no env entry with both a value
and a valueFrom, a GPU resource name the API accepts.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.test_manifests_golden import load_job, render_all

pytestmark = pytest.mark.cluster

WORKLOAD_KINDS = {"Pod", "Deployment", "Job"}


@pytest.mark.parametrize("case", ["pod-templates", "qwen-7b-hf", "llama-8b-8gpu"])
def test_every_merged_pod_is_accepted(cluster, namespace: str, case: str) -> None:
    job = load_job(case)
    job["metadata"]["namespace"] = namespace
    objects = [o for o in render_all(job) if o["kind"] in WORKLOAD_KINDS]
    assert {o["kind"] for o in objects} == WORKLOAD_KINDS
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
        res = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
        assert res.returncode == 0, f"{obj['kind']} {obj['metadata']['name']}: {res.stderr}"
