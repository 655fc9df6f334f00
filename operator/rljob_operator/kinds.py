"""The API groups, versions, kinds and resources the operator reads and writes, named once.

The RLJob's own group, version, kind and plural belong to its models
(`controller_runtime.api`, which the CRD is generated from); everything on the operator's side
that names them, or KubeRay's RayCluster, or a kind's REST resource, imports them from here.
"""

from __future__ import annotations

from controller_runtime.api import GROUP, KIND, PLURAL, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
LIST_KIND = f"{KIND}List"

# KubeRay: the RayCluster the executor's Ray head may run in instead of its own pod.
RAY_GROUP = "ray.io"
RAY_API_VERSION = f"{RAY_GROUP}/v1"
RAY_CLUSTER_KIND = "RayCluster"

# Kueue: the Workload an RLJob with a queue-name label is admitted as, and what it refers to.
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/v1beta2"
WORKLOAD_KIND = "Workload"
RESOURCE_FLAVOR_KIND = "ResourceFlavor"
WORKLOAD_PRIORITY_CLASS_KIND = "WorkloadPriorityClass"
PRIORITY_CLASS_API_VERSION = "scheduling.k8s.io/v1"
PRIORITY_CLASS_KIND = "PriorityClass"

# kind -> resource (plural): everything the operator writes; others fall back to kind+"s".
PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Deployment": "deployments",
    "Job": "jobs",
    "Event": "events",
    "Lease": "leases",
    "NetworkPolicy": "networkpolicies",
    RAY_CLUSTER_KIND: "rayclusters",
    WORKLOAD_KIND: "workloads",
    RESOURCE_FLAVOR_KIND: "resourceflavors",
    WORKLOAD_PRIORITY_CLASS_KIND: "workloadpriorityclasses",
    PRIORITY_CLASS_KIND: "priorityclasses",
    KIND: PLURAL,
}

__all__ = [
    "API_VERSION", "GROUP", "KIND", "KUEUE_API_VERSION", "KUEUE_GROUP", "LIST_KIND", "PLURAL", "PLURALS",
    "PRIORITY_CLASS_API_VERSION", "PRIORITY_CLASS_KIND", "RAY_API_VERSION", "RAY_CLUSTER_KIND", "RAY_GROUP",
    "RESOURCE_FLAVOR_KIND", "VERSION", "WORKLOAD_KIND", "WORKLOAD_PRIORITY_CLASS_KIND",
]
