"""Pure builders of the Kubernetes objects of an RLJob: dicts in, dicts out, no I/O.

Each takes the RLJob object (`{"metadata": ..., "spec": ...}`, spec raw or an `RLJobSpec`)
and returns manifests owned by it (controller owner reference), with deterministic names
(see `rljob_operator.names`). The kopf handlers decide what should exist and apply these.
"""

from rljob_operator.manifests.engine import engine_command, engine_pods, parallel_sizes
from rljob_operator.manifests.executor import executor_deployment, executor_service, rollout_address
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.netpol import PolicyPeers, network_policies
from rljob_operator.manifests.rayauth import ray_auth_secret
from rljob_operator.manifests.raycluster import ray_cluster
from rljob_operator.manifests.services import cells_headless_service, engines_service, engines_url
from rljob_operator.manifests.trainer import trainer_workload

__all__ = [
    "JobView",
    "PolicyPeers",
    "cells_headless_service",
    "engine_command",
    "engine_pods",
    "engines_service",
    "engines_url",
    "executor_deployment",
    "executor_service",
    "network_policies",
    "parallel_sizes",
    "ray_auth_secret",
    "ray_cluster",
    "rollout_address",
    "trainer_workload",
]
