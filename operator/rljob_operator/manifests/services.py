"""Services of the engine fleet.

* `<job>-cells` (headless, publishNotReadyAddresses): stable DNS names for every engine pod
  from the moment it has an IP, which multi-node rendezvous (Ray head, SGLang dist-init)
  needs before anything is ready.
* `<job>-engines`: the serving set. It selects the head pods of cells the controller marked
  `rljob.io/serving=true`, so routers and the RolloutExecutor discover engines the Kubernetes
  way (Endpoints/EndpointSlices) and a cell recreated mid-run joins only after the next
  completed weight update.
"""

from __future__ import annotations

from typing import Any

from rljob_operator import labels as L
from rljob_operator.manifests.job import JobView
from rljob_operator.names import cells_service_name, engines_service_name


def cells_headless_service(job: dict[str, Any] | JobView) -> dict[str, Any]:
    view = JobView.of(job)
    port = view.spec.inference.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": view.metadata(cells_service_name(view.name), L.ROLE_ENGINE),
        "spec": {
            "clusterIP": "None",
            "selector": L.engine_selector(view.name),
            "publishNotReadyAddresses": True,
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def engines_service(job: dict[str, Any] | JobView) -> dict[str, Any]:
    view = JobView.of(job)
    port = view.spec.inference.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": view.metadata(engines_service_name(view.name), L.ROLE_ENGINE),
        "spec": {
            "type": "ClusterIP",
            "selector": L.serving_selector(view.name),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def engines_url(job: dict[str, Any] | JobView) -> str:
    """Base URL of the serving set, as pods of the job's namespace reach it."""
    view = JobView.of(job)
    return f"http://{view.service_host(engines_service_name(view.name))}:{view.spec.inference.port}"
