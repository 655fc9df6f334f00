"""Ray token authentication for the job's rollout Ray: its Secret and the env that reads it.

Without it anyone who reaches `<job>-rollout:10001` (Ray Client), the dashboard or GCS can
run code in the executor pod: the class of CVE-2023-48022 ("ShadowRay"), which Ray answers
with token authentication (`RAY_AUTH_MODE=token`, Ray >= 2.52). The operator creates one
random token per job in the Secret `<job>-ray-auth` (owned by the RLJob) and hands it to the
processes that must speak Ray: the executor (which starts the head, so every Ray process it
spawns inherits the mode), the KubeRay head and workers when `spec.rollout.rayCluster` is
set, and the job's trainer pods (Ray Client). Engines and other pods never get it.

The token comes in as `RAY_AUTH_TOKEN` through a `secretKeyRef`, not a file: Ray reads
either, the pod spec then carries only the reference, and the test cluster's process agent
resolves references the way the kubelet does. The Secret is created once and never
re-applied: a re-apply would need the token again, and a new one would lock the running
executor's peers out.
"""

from __future__ import annotations

import base64
from typing import Any

from rljob_operator.manifests.job import JobView
from rljob_operator.names import ray_auth_secret_name

TOKEN_KEY = "token"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
ROLE_RAY_AUTH = "ray-auth"


def ray_auth_secret(job: dict[str, Any] | JobView, token: str) -> dict[str, Any]:
    """The job's Ray token Secret (create it once: see the module docstring)."""
    view = JobView.of(job)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": view.metadata(ray_auth_secret_name(view.name), ROLE_RAY_AUTH),
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def ray_auth_env(job: dict[str, Any] | JobView) -> list[dict[str, Any]]:
    """Env of a container that runs or calls the job's Ray: token mode and the token itself."""
    view = JobView.of(job)
    ref = {"secretKeyRef": {"name": ray_auth_secret_name(view.name), "key": TOKEN_KEY}}
    return [{"name": AUTH_MODE_ENV, "value": "token"}, {"name": AUTH_TOKEN_ENV, "valueFrom": ref}]
