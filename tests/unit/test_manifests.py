"""Targeted properties of the manifest builders (the golden files pin the whole shape)."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from rljob_operator import labels as L
from rljob_operator.manifests import (
    JobView,
    cells_headless_service,
    engine_pods,
    engines_service,
    executor_deployment,
    executor_service,
    network_policies,
    ray_cluster,
    trainer_workload,
)
from rljob_operator.names import dns_label, engine_pod_name, trainer_name

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.engine_extensions import WEIGHT_TRANSFER_EXTENSION
from controller_runtime.ports import CellRequest

JOBS = Path(__file__).parent / "golden" / "jobs"
KUBERAY_CRD = Path("/work/shared/third_party/kuberay/ray.io_rayclusters.yaml")
URL = "http://rljob-operator.rljob-system.svc:8443"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def job(case: str) -> dict[str, Any]:
    return yaml.safe_load((JOBS / f"{case}.yaml").read_text())


def cell(j: dict[str, Any] | JobView, index: int = 0, generation: int = 1) -> CellRequest:
    return CellRequest(name=f"{JobView.of(j).name}-cell-{index}", index=index, generation=generation)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def all_objects(j: dict[str, Any]) -> list[dict[str, Any]]:
    out = [cells_headless_service(j), engines_service(j), *engine_pods(j, cell(j))]
    out += [executor_deployment(j, URL), executor_service(j), *trainer_workload(j, URL)]
    rc = ray_cluster(j)
    return out + ([rc] if rc else [])


# --- engine pods -------------------------------------------------------------------------


def test_two_gpu_cells_request_two_gpus_in_limits_and_requests() -> None:
    pods = engine_pods(job("gpu-4x2"), cell(job("gpu-4x2")))
    assert len(pods) == 1
    res = container(pods[0])["resources"]
    assert res["requests"]["nvidia.com/gpu"] == "2" and res["limits"]["nvidia.com/gpu"] == "2"
    assert res["requests"]["cpu"] == "8" and res["limits"]["memory"] == "64Gi"


def test_multi_node_cell_spans_two_pods_of_eight_gpus() -> None:
    j = job("multinode-vllm")
    pods = engine_pods(j, cell(j, index=1, generation=3))
    assert [p["metadata"]["name"] for p in pods] == ["llama-70b-cell-1-g3-0", "llama-70b-cell-1-g3-1"]
    for p in pods:
        assert container(p)["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert [p["metadata"]["labels"][L.POD_INDEX] for p in pods] == ["0", "1"]


def test_cpu_cell_requests_no_gpu_and_passes_engine_args_through() -> None:
    j = job("cpu-process")
    (pod,) = engine_pods(j, cell(j))
    c = container(pod)
    assert "nvidia.com/gpu" not in str(c.get("resources", {}))
    cmd = c["command"]
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    tail = cmd[cmd.index("--pipeline-parallel-size") + 2 :]
    # a CPU engine always loads the worker extension: it asks for the AMX state vLLM's CPU
    # attention needs (without it the worker dies of SIGILL at its first request on AMX CPUs)
    assert tail == ["--worker-extension-cls", WEIGHT_TRANSFER_EXTENSION,
                    "--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager"]  # fmt: skip
    assert cmd[cmd.index("--host") + 1] == "$(POD_IP)"
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "1"
    assert "--enable-sleep-mode" not in cmd
    env = env_of(c)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert pod["metadata"]["labels"]["testcluster.rljob.io/run"] == "process"


def test_placement_is_copied_to_engine_pods() -> None:
    j = job("gpu-4x2")
    spec = engine_pods(j, cell(j))[0]["spec"]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["priorityClassName"] == "rl-training"
    assert engine_pods(job("multinode-vllm"), cell(job("multinode-vllm")))[0]["spec"]["affinity"][
        "podAntiAffinity"
    ]


def test_engine_pods_are_labelled_for_cell_generation_and_role() -> None:
    j = job("gpu-4x2")
    meta = engine_pods(j, CellRequest(name="llama-8b-cell-2", index=2, generation=5, labels={"extra": "x"}))[
        0
    ]["metadata"]
    assert meta["name"] == "llama-8b-cell-2-g5-0"
    labels = meta["labels"]
    assert labels[L.JOB] == "llama-8b"
    assert labels[L.CELL] == "llama-8b-cell-2"
    assert labels[L.CELL_INDEX] == "2"
    assert labels[L.GENERATION] == "5"
    assert labels[L.ROLE] == "engine"
    assert labels[L.MANAGED_BY] == "rljob-operator"
    assert labels[L.SERVING] == "false"
    assert labels["extra"] == "x"
    assert meta["annotations"]["example.com/team"] == "post-training"
    assert meta["annotations"][L.CELL_NAME_ANNOTATION] == "llama-8b-cell-2"


def test_a_cell_created_serving_has_its_head_labelled_and_gated_by_readiness() -> None:
    """A cell created serving (`CellRequest.serving`) joins the `-engines` Service without a label
    write: only its head carries the label, and only its head's readinessProbe (the engine's
    /health) keeps it out of the Service's endpoints until the engine answers."""
    j = job("multinode-vllm")
    head, worker = engine_pods(j, CellRequest(name="llama-70b-cell-0", index=0, generation=0, serving=True))
    assert head["metadata"]["labels"][L.SERVING] == "true"
    assert L.SERVING not in worker["metadata"]["labels"]
    probe = head["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"] == {"path": "/health", "port": "http"}
    assert all(head["metadata"]["labels"].get(k) == v for k, v in engines_service(j)["spec"]["selector"].items())


def test_user_labels_cannot_override_operator_labels() -> None:
    j = job("cpu-process")
    j["spec"]["inference"]["podMetadata"]["labels"][L.ROLE] = "hijack"
    assert engine_pods(j, cell(j))[0]["metadata"]["labels"][L.ROLE] == "engine"


def test_names_are_deterministic_and_new_generation_means_new_names() -> None:
    j = job("gpu-4x2")
    first = [p["metadata"]["name"] for p in engine_pods(j, cell(j, 0, 1))]
    again = [p["metadata"]["name"] for p in engine_pods(copy.deepcopy(j), cell(j, 0, 1))]
    later = [p["metadata"]["name"] for p in engine_pods(j, cell(j, 0, 2))]
    assert first == again
    assert set(first).isdisjoint(later)


def test_pods_get_hostname_and_subdomain_of_the_headless_service() -> None:
    j = job("multinode-vllm")
    svc = cells_headless_service(j)
    for p in engine_pods(j, cell(j)):
        assert p["spec"]["hostname"] == p["metadata"]["name"]
        assert p["spec"]["subdomain"] == svc["metadata"]["name"]
        assert p["spec"]["restartPolicy"] == "Never"


def test_vllm_multi_node_head_runs_ray_head_and_server_workers_join_it() -> None:
    j = job("multinode-vllm")
    head, worker = engine_pods(j, cell(j))
    head_script = container(head)["command"][2]
    worker_script = container(worker)["command"][2]
    assert "ray start --head" in head_script
    assert ">= 2 else 1" in head_script  # waits for both pods of the cell
    assert "--distributed-executor-backend ray" in head_script
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in head_script
    assert "--address=llama-70b-cell-0-g1-0.llama-70b-cells.rl.svc:6379" in worker_script
    assert "--block" in worker_script
    assert "readinessProbe" in container(head) and "readinessProbe" not in container(worker)
    assert container(head)["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_sglang_multi_node_pods_get_ranks_and_the_head_address() -> None:
    j = job("sglang-offload")
    j["spec"]["inference"]["gpusPerEngine"] = 16
    pods = engine_pods(j, cell(j))
    assert len(pods) == 2
    for rank, p in enumerate(pods):
        cmd = container(p)["command"]
        assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
        assert cmd[cmd.index("--nnodes") + 1] == "2"
        assert cmd[cmd.index("--node-rank") + 1] == str(rank)
        assert (
            cmd[cmd.index("--dist-init-addr") + 1] == "qwen-sglang-cell-0-g1-0.qwen-sglang-cells.rl.svc:50000"
        )
        assert cmd[cmd.index("--tp") + 1] == "8" and cmd[cmd.index("--pp-size") + 1] == "2"


def test_offload_enables_memory_saver_for_sglang_and_sleep_mode_for_vllm() -> None:
    j = job("sglang-offload")
    cmd = container(engine_pods(j, cell(j))[0])["command"]
    assert "--enable-memory-saver" in cmd
    assert cmd[-2:] == ["--mem-fraction-static", "0.7"]
    assert env_of(container(engine_pods(j, cell(j))[0]))["NCCL_DEBUG"] == "WARN"
    v = job("cpu-process")
    v["spec"]["inference"]["offload"] = {"enabled": True}
    assert "--enable-sleep-mode" in container(engine_pods(v, cell(v))[0])["command"]


def test_model_from_pvc_is_mounted_at_models_with_sub_path() -> None:
    j = job("gpu-4x2")
    pod = engine_pods(j, cell(j))[0]
    cmd = container(pod)["command"]
    assert cmd[cmd.index("--model") + 1] == "/models/meta-llama/Llama-3.1-8B-Instruct"
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
    assert vol["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container(pod)["volumeMounts"]


def test_model_path_is_mounted_from_the_node_at_the_same_path() -> None:
    j = job("cpu-process")
    pod = engine_pods(j, cell(j))[0]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
    assert vol["hostPath"]["path"] == "/var/cache/rljob/tiny-model"
    cmd = container(pod)["command"]
    assert cmd[cmd.index("--model") + 1] == "/var/cache/rljob/tiny-model"


# --- names, owners ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["cpu-process", "gpu-4x2", "multinode-vllm", "sglang-offload"])
def test_every_object_is_owned_by_the_rljob_as_controller(case: str) -> None:
    j = job(case)
    for obj in all_objects(j):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "rljob.io/v1alpha1",
            "kind": "RLJob",
            "name": j["metadata"]["name"],
            "uid": j["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert obj["metadata"]["namespace"] == j["metadata"]["namespace"]


def test_long_job_names_are_shortened_to_valid_distinct_dns_labels() -> None:
    base = job("multinode-vllm")
    names = {}
    for suffix in ("a", "b"):
        j = copy.deepcopy(base)
        j["metadata"]["name"] = "very.long-team-name." + "x" * 200 + suffix
        objs = all_objects(j)
        for obj in objs:
            name = obj["metadata"]["name"]
            assert len(name) <= 63 and DNS_LABEL.match(name), name
            for v in obj["metadata"]["labels"].values():
                assert len(v) <= 63
        pods = [o for o in objs if o["kind"] == "Pod"]
        assert all(p["metadata"]["name"].endswith(f"-cell-0-g1-{i}") for i, p in enumerate(pods))
        names[suffix] = {o["metadata"]["name"] for o in objs}
        # Indexed Job pod hostnames <trainer>-<index> stay within 63 characters
        assert len(trainer_name(j["metadata"]["name"]) + "-99999") <= 63
    assert names["a"].isdisjoint(names["b"])


def test_dns_label_keeps_valid_short_names_unchanged() -> None:
    assert dns_label("llama", "-cell-0-g1-0") == "llama-cell-0-g1-0"
    assert engine_pod_name("a" * 80, 3, 12, 1).endswith("-cell-3-g12-1")
    assert dns_label("Upper_Case") != "Upper_Case" and DNS_LABEL.match(dns_label("Upper_Case"))
    assert dns_label("9lives") != dns_label("lives")


def test_job_without_uid_cannot_own_anything() -> None:
    j = job("cpu-process")
    del j["metadata"]["uid"]
    with pytest.raises(ValueError, match="uid"):
        engines_service(j)


def test_parsed_spec_renders_the_same_as_the_raw_dict() -> None:
    raw = job("gpu-4x2")
    parsed = {"metadata": raw["metadata"], "spec": RLJobSpec.model_validate(raw["spec"])}
    assert all_objects(raw) == all_objects(parsed)
    assert all_objects(JobView.of(raw)) == all_objects(raw)


# --- services -----------------------------------------------------------------------------


def test_headless_service_selects_all_engine_pods_including_unready() -> None:
    svc = cells_headless_service(job("gpu-4x2"))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {L.JOB: "llama-8b", L.ROLE: "engine"}


def test_engines_service_selects_serving_cell_heads() -> None:
    j = job("gpu-4x2")
    svc = engines_service(j)
    assert svc["metadata"]["name"] == "llama-8b-engines"
    sel = svc["spec"]["selector"]
    assert sel == {L.JOB: "llama-8b", L.ROLE: "engine", L.SERVING: "true", L.POD_INDEX: "0"}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    pod_labels = engine_pods(j, cell(j))[0]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in sel.items() if k != L.SERVING)


# --- executor -----------------------------------------------------------------------------


def test_executor_is_one_replica_recreated_never_rolled() -> None:
    d = executor_deployment(job("gpu-4x2"), URL, service_account_name="rljob-executor")
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    pod = d["spec"]["template"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in d["spec"]["selector"]["matchLabels"].items())
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "rljob-executor" and spec["automountServiceAccountToken"] is True
    cmd = spec["containers"][0]["command"]
    assert cmd[:3] == ["python", "-m", "rollout_executor"]
    assert cmd[cmd.index("--job") + 1] == "llama-8b" and cmd[cmd.index("--namespace") + 1] == "rl"
    assert cmd[cmd.index("--controller-url") + 1] == URL
    assert cmd[cmd.index("--engines-url") + 1] == "http://llama-8b-engines.rl.svc:8000"
    assert cmd[cmd.index("--dataset") + 1] == "/models/datasets/gsm8k-train.jsonl"
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}


def test_executor_service_exposes_ray_client_dashboard_and_shard_data() -> None:
    svc = executor_service(job("gpu-4x2"))
    assert svc["metadata"]["name"] == "llama-8b-rollout"
    assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} == {
        ("ray-client", 10001),
        ("dashboard", 8265),
        ("shard-data", 10002),  # RolloutStream's HTTP side channel for shard bytes
    }
    assert svc["spec"]["selector"] == {L.JOB: "llama-8b", L.ROLE: "rollout"}
    ray_svc = executor_service(job("multinode-vllm"))
    assert ray_svc["spec"]["selector"] == {"ray.io/cluster": "llama-70b-ray", "ray.io/node-type": "head"}


# --- trainer ------------------------------------------------------------------------------


def test_trainer_is_an_indexed_job_with_torchrun_env() -> None:
    j = job("multinode-vllm")
    svc, tj = trainer_workload(j, URL)
    assert svc["spec"]["clusterIP"] == "None" and svc["metadata"]["name"] == "llama-70b-trainer"
    spec = tj["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    # Any rank's failure fails the Job at once (the operator restarts the gang), naming the rank.
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (0, 0) and "backoffLimit" not in spec
    assert tj["metadata"]["annotations"]["rljob.io/trainer-attempt"] == "0"
    assert trainer_workload(j, URL, 2)[1]["metadata"]["annotations"]["rljob.io/trainer-attempt"] == "2"
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "llama-70b-trainer" and pod["restartPolicy"] == "Never"
    assert all(spec["template"]["metadata"]["labels"][k] == v for k, v in svc["spec"]["selector"].items())
    env = env_of(pod["containers"][0])
    assert env["MASTER_ADDR"] == "llama-70b-trainer-0.llama-70b-trainer"
    assert env["MASTER_PORT"] == "29500"
    assert env["WORLD_SIZE"] == "4"
    assert env["RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["RLJOB_ROLLOUT_ADDRESS"] == "ray://llama-70b-rollout:10001"
    assert env["RLJOB_CONTROLLER_URL"] == URL
    assert (env["RLJOB_NAME"], env["RLJOB_NAMESPACE"]) == ("llama-70b", "rl")
    # The window holder is the Job's, not the pod's: a restart (new pods) knows its predecessor's window.
    assert env["RLJOB_WINDOW_HOLDER"] == "llama-70b-trainer"
    assert env_of(trainer_workload(j, URL, 2)[1]["spec"]["template"]["spec"]["containers"][0])[
        "RLJOB_WINDOW_HOLDER"] == "llama-70b-trainer"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["containers"][0]["command"] == ["python", "-m", "rljob_client.trainer"]


def test_trainer_uses_service_account_placement_and_user_command() -> None:
    j = job("gpu-4x2")
    j["spec"]["trainer"]["command"] = ["torchrun", "train.py"]
    j["spec"]["trainer"]["args"] = ["--epochs", "1"]
    pod = trainer_workload(j, URL)[1]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rljob-trainer"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["containers"][0]["command"] == ["torchrun", "train.py"]
    assert pod["containers"][0]["args"] == ["--epochs", "1"]


def test_no_trainer_workload_for_workload_ref_or_zero_replicas() -> None:
    assert trainer_workload(job("sglang-offload"), URL) == []
    j = job("cpu-process")
    j["spec"]["trainer"]["replicas"] = 0
    assert trainer_workload(j, URL) == []


# --- RayCluster ---------------------------------------------------------------------------


@functools.cache
def kuberay_schema() -> dict[str, Any]:
    crd = yaml.load(KUBERAY_CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.skipif(not KUBERAY_CRD.exists(), reason=f"KubeRay CRD not found at {KUBERAY_CRD}")
def test_ray_cluster_validates_against_the_kuberay_crd_schema() -> None:
    rc = ray_cluster(job("multinode-vllm"))
    assert rc is not None
    jsonschema.validate(rc, kuberay_schema())
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "client", "containerPort": 10001} in head["ports"]
    (workers,) = rc["spec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2


@pytest.mark.skipif(not KUBERAY_CRD.exists(), reason=f"KubeRay CRD not found at {KUBERAY_CRD}")
def test_schema_check_catches_a_broken_ray_cluster() -> None:
    rc = ray_cluster(job("multinode-vllm"))
    assert rc is not None
    del rc["spec"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rc, kuberay_schema())


def test_ray_cluster_pods_carry_the_rollout_pod_metadata_and_no_usage_stats() -> None:
    """The rollout runs in the head pod, so the rollout's pod labels/annotations go there (the
    real KubeRay copies the template's metadata onto the pods: tests/e2e/test_kuberay_rollout.py);
    Ray's usage reporting is off like on every other Ray head the operator starts."""
    j = job("multinode-vllm")
    j["spec"]["rollout"]["podMetadata"] = {
        "labels": {"team": "rl", L.JOB: "spoofed"},
        "annotations": {"sidecar.istio.io/inject": "false"},
    }
    rc = ray_cluster(j)
    assert rc is not None
    groups = [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]
    for group in groups:
        meta = group["template"]["metadata"]
        assert meta["labels"]["team"] == "rl"
        assert meta["labels"][L.JOB] == "llama-70b"  # the job's own labels win over the user's
        assert meta["annotations"] == {"sidecar.istio.io/inject": "false"}
        assert group["rayStartParams"]["disable-usage-stats"] == "true"
    assert groups[0]["template"]["metadata"] is not groups[1]["template"]["metadata"]


def test_ray_cluster_pods_run_as_the_executors_service_account() -> None:
    """The rollout actor runs in the RayCluster and reads its pod's token for the controller API:
    that must be the executor's ServiceAccount (the trainer's), not the namespace's default."""
    j = job("multinode-vllm")
    j["spec"]["trainer"]["serviceAccountName"] = "rl-trainer"
    rc = ray_cluster(j)
    assert rc is not None
    executor_spec = executor_deployment(j, URL)["spec"]["template"]["spec"]
    for group in (rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]):
        spec = group["template"]["spec"]
        assert spec["serviceAccountName"] == executor_spec["serviceAccountName"] == "rl-trainer"
        assert spec["automountServiceAccountToken"] is True


def test_a_suspended_job_scales_its_executor_to_zero_and_suspends_its_ray_cluster() -> None:
    """Suspended (by the user or by Kueue's preemption), the job holds no rollout pod either."""
    j = job("multinode-vllm")
    for suspend, replicas in ((False, 1), (True, 0)):
        j["spec"]["suspend"] = suspend
        assert executor_deployment(j, URL)["spec"]["replicas"] == replicas
        rc = ray_cluster(j)
        assert rc is not None and rc["spec"]["suspend"] is suspend


def test_engines_admit_the_ray_cluster_pods_that_run_the_rollout() -> None:
    """With a RayCluster the actor generating against the engines lives in a `ray` pod."""
    j = job("multinode-vllm")
    engines = next(p for p in network_policies(j) if p["metadata"]["labels"][L.ROLE] == L.ROLE_ENGINE)
    allowed = {v for rule in engines["spec"]["ingress"] for peer in rule["from"]
               for e in peer.get("podSelector", {}).get("matchExpressions", []) for v in e["values"]}  # fmt: skip
    assert {"ray", L.ROLE_ROLLOUT, L.ROLE_TRAINER} <= allowed


def test_no_ray_cluster_unless_asked_for() -> None:
    assert ray_cluster(job("gpu-4x2")) is None


# --- volumes of the shipped example -------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict[str, Any]:
    j = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    j["metadata"].update(namespace="rl", uid="00000000-0000-4000-8000-00000000e0e0")
    return j


@pytest.mark.skipif(
    not (EXAMPLES / "llama-8b-8gpu.yaml").exists(), reason="examples/llama-8b-8gpu.yaml not present"
)
def test_shared_checkpoints_pvc_is_read_only_in_engines_and_writable_in_trainer() -> None:
    j = example("llama-8b-8gpu")
    engine = container(engine_pods(j, cell(j))[0])
    trainer = trainer_workload(j, URL)[1]["spec"]["template"]["spec"]
    mount = {m["name"]: m for m in engine["volumeMounts"]}["checkpoints"]
    assert mount == {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}
    tmount = {m["name"]: m for m in trainer["containers"][0]["volumeMounts"]}["checkpoints"]
    assert tmount == {"name": "checkpoints", "mountPath": "/checkpoints"}
    vol = {v["name"]: v for v in trainer["volumes"]}["checkpoints"]
    assert vol["persistentVolumeClaim"]["claimName"] == "rl-checkpoints"


@pytest.mark.skipif(
    not (EXAMPLES / "llama-8b-8gpu.yaml").exists(), reason="examples/llama-8b-8gpu.yaml not present"
)
def test_dataset_pvc_is_mounted_at_data_and_the_path_resolved_inside_it() -> None:
    spec = executor_deployment(example("llama-8b-8gpu"), URL)["spec"]["template"]["spec"]
    cmd = spec["containers"][0]["command"]
    assert cmd[cmd.index("--dataset") + 1] == "/data/gsm8k/train.jsonl"
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in spec["containers"][0]["volumeMounts"]
    assert {v["name"]: v for v in spec["volumes"]}["data"]["persistentVolumeClaim"]["claimName"] == "datasets"


def test_relative_model_path_is_passed_through_without_a_volume() -> None:
    j = job("cpu-process")
    j["spec"]["model"]["path"] = "./.cache/tiny-model"
    pod = engine_pods(j, cell(j))[0]
    cmd = container(pod)["command"]
    assert cmd[cmd.index("--model") + 1] == "./.cache/tiny-model"
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm"]
    assert "volumes" not in executor_deployment(j, URL)["spec"]["template"]["spec"]


def test_trainer_is_told_the_engine_pause_mode_and_no_offload_tags() -> None:
    """Trainer pods never share the engines' GPUs (spec.trainer.colocate is refused): no offload around training."""
    j = job("sglang-offload")
    j["spec"]["trainer"] = {"replicas": 1, "gpusPerReplica": 8}
    _, tj = trainer_workload(j, URL)
    env = env_of(container(tj["spec"]["template"]))
    assert env["RLJOB_ENGINE"] == "sglang"
    assert env["RLJOB_PAUSE_MODE"] == JobView.of(j).spec.inference.weight_update.pause_mode
    assert env["RLJOB_OFFLOAD_TAGS"] == ""
    j["spec"]["trainer"]["colocate"] = True
    with pytest.raises(ValueError, match=r"spec\.trainer\.colocate is deprecated"):
        trainer_workload(j, URL)


def test_executor_pods_carry_the_users_pod_metadata_but_not_over_operator_labels() -> None:
    j = job("cpu-process")
    j["spec"]["rollout"]["podMetadata"] = {"labels": {"extra": "x", L.ROLE: "hijack"},
                                           "annotations": {"example.com/team": "post-training"}}
    dep = executor_deployment(j, "http://c")
    meta = dep["spec"]["template"]["metadata"]
    assert meta["labels"]["extra"] == "x"
    assert meta["labels"][L.ROLE] == "rollout"
    assert meta["annotations"]["example.com/team"] == "post-training"
    assert meta["annotations"][L.JOB_NAME_ANNOTATION] == j["metadata"]["name"]
    # Pod metadata is not part of what the executor acts on: changing it does not change its spec.
    plain = executor_deployment(job("cpu-process"), "http://c")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    plain_env = {e["name"]: e.get("value") for e in plain["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLJOB_EXECUTOR_SPEC"] == plain_env["RLJOB_EXECUTOR_SPEC"]


def test_executor_runs_as_the_trainers_service_account_unless_told_otherwise() -> None:
    j = job("cpu-process")
    j["spec"]["trainer"]["serviceAccountName"] = "team-trainer"
    assert executor_deployment(j, URL)["spec"]["template"]["spec"]["serviceAccountName"] == "team-trainer"
    explicit = executor_deployment(j, URL, service_account_name="rljob-executor")
    assert explicit["spec"]["template"]["spec"]["serviceAccountName"] == "rljob-executor"
    assert "serviceAccountName" not in executor_deployment(job("cpu-process"), URL)["spec"]["template"]["spec"]


def test_the_executor_keeps_its_dataset_position_on_shared_storage_only() -> None:
    """Issue 12: a replaced executor pod resumes from <sharedPath>/<job>/executor, which must outlive the pod."""
    disk = job("gpu-4x2")
    cmd = container(executor_deployment(disk, URL)["spec"]["template"])["command"]
    name, shared = disk["metadata"]["name"], RLJobSpec.model_validate(disk["spec"]).inference.weight_update.shared_path
    assert cmd[cmd.index("--state-dir") + 1] == f"{shared}/{name}/executor"

    nccl = copy.deepcopy(disk)
    nccl["spec"]["inference"]["weightUpdate"] = {"method": "nccl"}  # no PVC: sharedPath is the pod's own disk
    pod = executor_deployment(nccl, URL)["spec"]["template"]
    assert "--state-dir" not in container(pod)["command"]
    assert not any(v["name"] == "checkpoints" for v in pod["spec"].get("volumes", []))
