"""Pod-spec pieces shared by engine, executor and trainer pods: placement, resources, model volume."""

from __future__ import annotations

import posixpath
from typing import Any

from controller_runtime.api.podtemplate import (
    DEFAULT_GPU_RESOURCE,
    FETCH_DATASET_CONTAINER,
    FETCH_MODEL_CONTAINER,
)
from controller_runtime.api.spec import (
    DatasetSpec,
    EnvVar,
    ModelSpec,
    Placement,
    Resources,
    RLJobSpec,
    WeightUpdateSpec,
)

MODEL_VOLUME = "model"
MODELS_MOUNT = "/models"
CHECKPOINTS_VOLUME = "checkpoints"
DATA_VOLUME = "data"
DATA_MOUNT = "/data"
SHM_VOLUME = "dshm"
FETCH_MODULE = "rljob_client.fetch"
HF_TOKEN_KEY = "HF_TOKEN"


def placement_fields(placement: Placement) -> dict[str, Any]:
    """nodeSelector, tolerations, affinity, priorityClassName as Pod spec fields (only those set)."""
    out: dict[str, Any] = {}
    if placement.node_selector:
        out["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        out["tolerations"] = [t.to_wire() for t in placement.tolerations]
    if placement.affinity:
        out["affinity"] = placement.affinity
    if placement.priority_class_name:
        out["priorityClassName"] = placement.priority_class_name
    return out


def container_resources(resources: Resources, gpus: int, gpu_resource: str = DEFAULT_GPU_RESOURCE) -> dict[str, Any]:
    """The user's requests/limits plus `<gpu_resource>: gpus` in both (extended resources need equal values)."""
    requests = dict(resources.requests)
    limits = dict(resources.limits)
    if gpus > 0:
        requests[gpu_resource] = str(gpus)
        limits[gpu_resource] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def model_path(model: ModelSpec) -> str:
    """Where the model directory appears inside a pod.

    A PVC is mounted whole at /models (read-only) and the model is /models/<subPath>, so a
    tokenizer elsewhere in the same claim stays reachable; an absolute path is mounted from
    the node at the same path (hostPath). A relative path is passed through unmounted: it
    only means something to processes started in a known working directory (local mode,
    the test cluster's process agent, which runs pods' commands from the repository root).
    """
    if model.uri is not None:
        return _download_dir(MODELS_MOUNT, model.uri)
    if model.pvc is not None:
        sub = model.pvc.sub_path.strip("/")
        return posixpath.join(MODELS_MOUNT, sub) if sub else MODELS_MOUNT
    assert model.path is not None
    return model.path


def _download_dir(mount: str, uri: str) -> str:
    """hf://ORG/NAME@REV -> <mount>/hf/ORG/NAME/REV: one directory per revision in a shared cache."""
    repo, _, revision = uri.removeprefix("hf://").partition("@")
    return posixpath.join(mount, "hf", repo, revision or "main")


def _download_volume(model: ModelSpec) -> dict[str, Any]:
    if model.cache is not None:
        return {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": model.cache.claim_name}}
    return {"name": MODEL_VOLUME, "emptyDir": {}}


def _download_mount(model: ModelSpec, read_only: bool) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": MODEL_VOLUME, "mountPath": MODELS_MOUNT}
    if model.cache is not None and model.cache.sub_path.strip("/"):
        mount["subPath"] = model.cache.sub_path.strip("/")
    if read_only:
        mount["readOnly"] = True
    return mount


def fetch_image(spec: RLJobSpec) -> str:
    """An image that ships rljob_client and huggingface_hub: the executor's, else the trainer's."""
    return spec.rollout.image if spec.rollout is not None else spec.trainer.image


def model_fetch_containers(spec: RLJobSpec, security_context: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The init container that downloads spec.model.uri into the model volume ([] for a path or PVC).

    It runs in every pod that reads the model, from an image that ships rljob_client (the
    executor's or trainer's); a failure that retrying cannot fix fails the pod once with the
    cause as its termination message (`rljob_client.fetch`)."""
    model = spec.model
    if model.uri is None:
        return []
    command = ["python", "-m", FETCH_MODULE, "--uri", model.uri, "--dest", model_path(model)]
    mount = _download_mount(model, read_only=False)
    return [_fetch_container(FETCH_MODEL_CONTAINER, fetch_image(spec), command, mount, model.credentials_secret, security_context)]


def dataset_fetch_containers(spec: RLJobSpec, security_context: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The executor's init container that downloads spec.rollout.dataset.uri to /data ([] without one)."""
    dataset = spec.executor.dataset
    if dataset.uri is None:
        return []
    command = ["python", "-m", FETCH_MODULE, "--uri", dataset.uri, "--dest", _download_dir(DATA_MOUNT, dataset.uri),
               "--repo-type", "dataset"]  # fmt: skip
    mount = {"name": DATA_VOLUME, "mountPath": DATA_MOUNT}
    return [_fetch_container(FETCH_DATASET_CONTAINER, fetch_image(spec), command, mount, dataset.credentials_secret,
                             security_context)]  # fmt: skip


def _fetch_container(
    name: str, image: str, command: list[str], mount: dict[str, Any], secret: str | None, security_context: dict[str, Any] | None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": command,
        "volumeMounts": [mount],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if secret:
        ref = {"name": secret, "key": HF_TOKEN_KEY}
        container["env"] = [{"name": HF_TOKEN_KEY, "valueFrom": {"secretKeyRef": ref}}]
    if security_context:
        container["securityContext"] = security_context
    return container


def model_volume(model: ModelSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(volume, volumeMount) for the model, read-only; None for a relative path."""
    if model.uri is not None:
        return _download_volume(model), _download_mount(model, read_only=True)
    if model.pvc is not None:
        volume = {
            "name": MODEL_VOLUME,
            "persistentVolumeClaim": {"claimName": model.pvc.claim_name, "readOnly": True},
        }
        mount = {"name": MODEL_VOLUME, "mountPath": MODELS_MOUNT, "readOnly": True}
        return volume, mount
    assert model.path is not None
    if not posixpath.isabs(model.path):
        return None
    volume = {"name": MODEL_VOLUME, "hostPath": {"path": model.path, "type": "Directory"}}
    mount = {"name": MODEL_VOLUME, "mountPath": model.path, "readOnly": True}
    return volume, mount


def checkpoints_volume(
    weight_update: WeightUpdateSpec, read_only: bool
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The shared weights PVC at sharedPath (engines read it, the trainer writes it); None without one."""
    pvc = weight_update.pvc
    if pvc is None:
        return None
    volume = {"name": CHECKPOINTS_VOLUME, "persistentVolumeClaim": {"claimName": pvc.claim_name}}
    mount: dict[str, Any] = {"name": CHECKPOINTS_VOLUME, "mountPath": weight_update.shared_path}
    if pvc.sub_path.strip("/"):
        mount["subPath"] = pvc.sub_path.strip("/")
    if read_only:
        mount["readOnly"] = True
    return volume, mount


def dataset_path(dataset: DatasetSpec) -> str:
    """The dataset file inside the executor pod: relative to /data when it comes from a PVC, to the
    downloaded repository when it comes from the hub."""
    if dataset.uri is not None and not posixpath.isabs(dataset.path):
        return posixpath.join(_download_dir(DATA_MOUNT, dataset.uri), dataset.path)
    if dataset.pvc is not None and not posixpath.isabs(dataset.path):
        return posixpath.join(DATA_MOUNT, dataset.path)
    return dataset.path


def dataset_volume(dataset: DatasetSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The dataset PVC (or the download's emptyDir) at /data, read-only; None when the path is in the image or on the node."""
    if dataset.uri is not None:
        return {"name": DATA_VOLUME, "emptyDir": {}}, {"name": DATA_VOLUME, "mountPath": DATA_MOUNT, "readOnly": True}
    pvc = dataset.pvc
    if pvc is None:
        return None
    volume = {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}}
    mount: dict[str, Any] = {"name": DATA_VOLUME, "mountPath": DATA_MOUNT, "readOnly": True}
    if pvc.sub_path.strip("/"):
        mount["subPath"] = pvc.sub_path.strip("/")
    return volume, mount


def volumes(
    *pairs: tuple[dict[str, Any], dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """([volumes], [volumeMounts]) from (volume, mount) pairs, skipping the absent ones."""
    present = [p for p in pairs if p is not None]
    return [v for v, _ in present], [m for _, m in present]


def shm_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """A memory-backed /dev/shm: the container default (64 MiB) is too small for NCCL and torch workers."""
    return (
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    )


def env_value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def env_field(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def user_env(env: list[EnvVar]) -> list[dict[str, Any]]:
    return [e.to_pod() for e in env]


def merge_env(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """base then extra; a name in extra replaces the same name in base (the user wins), order kept."""
    names = {e["name"] for e in extra}
    return [e for e in base if e["name"] not in names] + extra
