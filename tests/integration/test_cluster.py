"""The test cluster itself: real control plane, kwok GPU nodes, CRDs, controllers, tools."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import textwrap

import pytest
from kubernetes import client

pytestmark = pytest.mark.cluster

GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def pod_manifest(name: str, gpus: int = 0, tolerate_gpu: bool = False, labels: dict | None = None) -> dict:
    resources = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict = {
        "containers": [{"name": "main", "image": "example.invalid/none:0", "resources": resources}],
        "restartPolicy": "Never",
    }
    if tolerate_gpu:
        spec["tolerations"] = GPU_TOLERATION
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def test_gpu_pod_is_scheduled_on_a_gpu_node_and_runs(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    core.create_namespaced_pod(namespace, pod_manifest("two-gpus", gpus=2, tolerate_gpu=True))
    pod = cluster.wait_pod_phase(namespace, "two-gpus", "Running", timeout=60)
    assert pod.spec.node_name.startswith("gpu-"), pod.spec.node_name
    node = core.read_node(pod.spec.node_name)
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node.spec.pod_cidr)
    assert pod.status.host_ip == next(a.address for a in node.status.addresses if a.type == "InternalIP")


def test_pod_asking_more_gpus_than_a_node_has_stays_pending(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    core.create_namespaced_pod(namespace, pod_manifest("sixteen-gpus", gpus=16, tolerate_gpu=True))

    def unschedulable(pod):
        cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
        return cond is not None and cond.status == "False" and cond.reason == "Unschedulable"

    pod = cluster.wait_pod(namespace, "sixteen-gpus", unschedulable, timeout=60)
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert "Insufficient nvidia.com/gpu" in cond.message, cond.message
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name


def test_gpu_taint_keeps_untolerating_pods_on_cpu_nodes(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    for i in range(3):
        core.create_namespaced_pod(namespace, pod_manifest(f"plain-{i}"))
    for i in range(3):
        pod = cluster.wait_pod_phase(namespace, f"plain-{i}", "Running", timeout=60)
        assert pod.spec.node_name.startswith("cpu-"), pod.spec.node_name


def test_custom_resource_definition_is_served_and_validated(cluster, namespace):
    crd = textwrap.dedent("""\
        apiVersion: apiextensions.k8s.io/v1
        kind: CustomResourceDefinition
        metadata:
          name: probes.testcluster.rljob.io
        spec:
          group: testcluster.rljob.io
          scope: Namespaced
          names: {plural: probes, singular: probe, kind: Probe}
          versions:
          - name: v1
            served: true
            storage: true
            schema:
              openAPIV3Schema:
                type: object
                properties:
                  spec:
                    type: object
                    required: [replicas]
                    properties:
                      replicas: {type: integer, minimum: 1}
        """)
    cluster.kubectl("apply", "-f", "-", input=crd)
    cluster.wait_established("probes.testcluster.rljob.io")
    good = "apiVersion: testcluster.rljob.io/v1\nkind: Probe\nmetadata: {name: good}\nspec: {replicas: 2}\n"
    cluster.wait_for(lambda: cluster.kubectl("-n", namespace, "apply", "-f", "-", input=good, check=False)
                     .returncode == 0, timeout=30, what="the new CRD to be served")
    got = json.loads(cluster.kubectl("-n", namespace, "get", "probe", "good", "-o", "json").stdout)
    assert got["spec"]["replicas"] == 2
    bad = "apiVersion: testcluster.rljob.io/v1\nkind: Probe\nmetadata: {name: bad}\nspec: {replicas: 0}\n"
    res = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=bad, check=False)
    assert res.returncode != 0
    assert "spec.replicas" in res.stderr


def test_kuberay_raycluster_crd_is_installed_and_validates(cluster, namespace):
    res = cluster.kubectl("get", "crd", "rayclusters.ray.io", "-o",
                          "jsonpath={.status.conditions[?(@.type=='Established')].status}")
    assert res.stdout == "True"
    # headGroupSpec is required by the schema: the API server must refuse this object.
    bad = "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: bad}\nspec: {rayVersion: '2.40.0'}\n"
    res = cluster.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", "-", input=bad, check=False)
    assert res.returncode != 0
    assert "headGroupSpec" in res.stderr


def test_deployment_gets_replicaset_and_pods_and_deleting_it_collects_them(cluster, namespace):
    apps = client.AppsV1Api(cluster.api())
    core = client.CoreV1Api(cluster.api())
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:0"}]},
            },
        },
    }
    apps.create_namespaced_deployment(namespace, dep)
    rs = cluster.wait_for(lambda: apps.list_namespaced_replica_set(namespace, label_selector="app=web").items,
                          timeout=60, what="the Deployment's ReplicaSet")
    assert rs[0].metadata.owner_references[0].kind == "Deployment"
    cluster.wait_for(
        lambda: apps.read_namespaced_deployment(namespace=namespace, name="web").status.available_replicas == 3,
        timeout=90, what="3 available replicas",
    )
    pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
    assert len(pods) == 3 and all(p.status.phase == "Running" for p in pods)
    assert all(p.metadata.owner_references[0].name == rs[0].metadata.name for p in pods)

    apps.delete_namespaced_deployment("web", namespace, propagation_policy="Background")
    cluster.wait_for(
        lambda: not apps.list_namespaced_replica_set(namespace, label_selector="app=web").items
        and not core.list_namespaced_pod(namespace, label_selector="app=web").items,
        timeout=90, what="garbage collection of the ReplicaSet and its pods",
    )


def test_owner_reference_garbage_collection(cluster, namespace):
    core = client.CoreV1Api(cluster.api())
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "child", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})
    core.delete_namespaced_config_map("owner", namespace)

    def child_gone():
        try:
            core.read_namespaced_config_map("child", namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    cluster.wait_for(child_gone, timeout=60, what="the child ConfigMap to be garbage-collected")


def test_kubectl_get_describe_and_versions(cluster):
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["clientVersion"]["gitVersion"] == "v1.36.3"
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"
    nodes = cluster.kubectl("get", "nodes", "-o", "wide").stdout
    for name in ("gpu-0", "gpu-3", "cpu-0", "cpu-1"):
        assert name in nodes
    assert "NotReady" not in nodes
    desc = cluster.kubectl("describe", "node", "gpu-0").stdout
    assert "nvidia.com/gpu=present:NoSchedule" in desc
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in desc
    net = int(os.environ.get("RLJOB_TESTCLUSTER_NET", "0"))
    assert f"127.{10 + net}.0.0/24" in desc
    helm = cluster.helm("version", "--short").stdout.strip()
    assert helm.startswith("v3.22.0"), helm
    cluster.helm("list", "--all-namespaces")  # helm reaches the API server
    etcd = subprocess.run([str(cluster.bin_dir / "etcd"), "--version"], capture_output=True, text=True, check=True)
    assert "etcd Version: 3.6.16" in etcd.stdout
