"""The pod-template merge (`manifests/template.py`) and its refusals, rule by rule."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rljob_operator.manifests import engine_pods, executor_deployment, trainer_workload
from rljob_operator.manifests.template import apply_template, merge

from controller_runtime.api import RLJobManifest
from controller_runtime.api.podtemplate import PodTemplate
from controller_runtime.ports import CellRequest
from tests.unit.test_manifests_golden import CONTROLLER_URL, JOBS


def test_maps_merge_key_by_key_with_the_template_winning() -> None:
    base = {"nodeSelector": {"a": "1", "b": "1"}, "securityContext": {"runAsNonRoot": True, "runAsUser": 1}}
    out = merge(base, {"nodeSelector": {"b": "2"}, "securityContext": {"runAsUser": 1000}})
    assert out == {"nodeSelector": {"a": "1", "b": "2"}, "securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}
    assert base["nodeSelector"] == {"a": "1", "b": "1"}, "the operator's pod is not modified"


def test_containers_merge_by_name_and_new_ones_are_added() -> None:
    base = {"containers": [{"name": "engine", "image": "e", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}]}]}
    overlay = {"containers": [
        {"name": "side", "image": "s"},
        {"name": "engine", "env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}, {"name": "C", "value": "3"}]},
    ]}  # fmt: skip
    out = merge(base, overlay)
    assert [c["name"] for c in out["containers"]] == ["engine", "side"]
    assert out["containers"][0]["image"] == "e"
    assert out["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},  # replaced whole: no value beside valueFrom
        {"name": "C", "value": "3"},
    ]


def test_volumes_are_replaced_whole_by_name() -> None:
    base = {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "model", "hostPath": {"path": "/m"}}]}
    out = merge(base, {"volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "c"}}]})
    assert out["volumes"][1] == {"name": "model", "persistentVolumeClaim": {"claimName": "c"}}


def test_ports_merge_by_container_port_and_mounts_by_path() -> None:
    base = {"ports": [{"containerPort": 80, "name": "http"}], "volumeMounts": [{"name": "a", "mountPath": "/x"}]}
    out = merge(base, {"ports": [{"containerPort": 80, "hostPort": 80}], "volumeMounts": [{"name": "b", "mountPath": "/x"}]})
    assert out["ports"] == [{"containerPort": 80, "name": "http", "hostPort": 80}]
    assert out["volumeMounts"] == [{"name": "b", "mountPath": "/x"}]


def test_unkeyed_lists_append_and_affinity_is_replaced() -> None:
    terms = {"nodeAffinity": {"required": {"terms": [{"k": "a"}]}}}
    base = {"tolerations": [{"key": "a"}], "affinity": terms}
    new_affinity = {"podAntiAffinity": {"preferred": []}}
    out = merge(base, {"tolerations": [{"key": "b"}], "affinity": new_affinity})
    assert out["tolerations"] == [{"key": "a"}, {"key": "b"}]
    assert out["affinity"] == new_affinity


def test_operator_labels_win_and_template_metadata_is_added() -> None:
    template = PodTemplate.model_validate({"metadata": {"labels": {"team": "rl", "app.kubernetes.io/managed-by": "me"}}})
    labels, annotations, spec = apply_template({"app.kubernetes.io/managed-by": "rljob-operator"}, {}, {}, template)
    assert labels == {"team": "rl", "app.kubernetes.io/managed-by": "rljob-operator"}
    assert spec == {} and annotations == {}


def _job() -> dict[str, Any]:
    return yaml.safe_load((JOBS / "pod-templates.yaml").read_text())


def test_every_role_gets_its_template_and_the_gpu_resource_name() -> None:
    job = _job()
    engine = engine_pods(job, CellRequest(name="qwen-tpl-cell-0", index=0, generation=1))[0]["spec"]
    executor = executor_deployment(job, CONTROLLER_URL)["spec"]["template"]["spec"]
    trainer = trainer_workload(job, CONTROLLER_URL)[1]["spec"]["template"]["spec"]
    assert engine["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in engine["containers"][0]["resources"]["limits"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in engine["volumes"]
    assert engine["schedulerName"] == "volcano" and engine["restartPolicy"] == "Never"
    assert {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "judge", "key": "key"}}} in executor["containers"][0]["env"]
    assert executor["securityContext"]["fsGroup"] == 2000 and executor["securityContext"]["runAsNonRoot"] is True
    assert trainer["hostNetwork"] is True and trainer["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "8"
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}} in trainer["containers"][0]["env"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"command": ["sh"]}, "spec.inference.template.spec.containers[name=engine].command"),
        ({"resources": {"requests": {"amd.com/gpu": "1"}}}, "spec.inference.template.spec.containers[name=engine].resources"),
    ],
)
def test_local_mode_refuses_what_the_operator_owns(edit: dict[str, Any], field: str) -> None:
    job = _job()
    job["spec"]["inference"]["template"]["spec"]["containers"][0].update(edit)
    with pytest.raises(ValidationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        RLJobManifest.model_validate(job)
