"""The README's annotated RLJob is a real one: the API server accepts it as written."""

from __future__ import annotations

import re

import yaml

from controller_runtime.api.spec import RLJobSpec
from tests.cluster.fixtures import Cluster
from tests.e2e.conftest import REPO


def readme_rljob() -> str:
    section = (REPO / "README.md").read_text().split("## RLJob reference", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return block


def test_readme_example_validates_locally() -> None:
    job = yaml.safe_load(readme_rljob())
    assert job["kind"] == "RLJob"
    RLJobSpec.model_validate(job["spec"])


def test_readme_example_is_accepted_by_the_api_server(cluster: Cluster, namespace: str, rljob_crd) -> None:
    res = cluster.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", "-", input=readme_rljob())
    assert "rljob.rljob.io/qwen-grpo created (server dry run)" in res.stdout
