"""Reading an RLJob manifest for local mode: validation errors that name the field, paths made absolute.

The manifest is parsed by the same pydantic models the CRD is generated from, so local mode
accepts and rejects what the API server would. Relative paths are relative to the directory
`rljob run` is started from (as examples/*.yaml say); they are resolved once here so that
every process (engines, executor, trainer) sees the same absolute path, which is also the
model name vLLM serves under.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controller_runtime.api.spec import RLJobManifest

TOY_MODEL_DIRNAME = "tiny-model"


class ManifestError(Exception):
    """The manifest is unreadable or invalid; the message names the field."""


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = field_path(tuple(err.get("loc", ()))) or "manifest"
        lines.append(f"{where}: {err.get('msg', 'invalid')}")
    return "\n  - ".join(lines)


def load_manifest(path: str | os.PathLike[str]) -> RLJobManifest:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ManifestError(f"{p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{p}: expected an RLJob object, got {type(data).__name__}")
    try:
        return RLJobManifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(f"{p} is not a valid RLJob:\n  - {describe(exc)}") from exc


def job_name(manifest: RLJobManifest, path: str | os.PathLike[str]) -> str:
    name = manifest.metadata.get("name")
    return str(name) if name else Path(path).stem


def resolve(path: str, cwd: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (cwd / p).resolve()


def resolve_paths(manifest: RLJobManifest, cwd: Path) -> RLJobManifest:
    """A copy with model, tokenizer and dataset paths absolute; the dataset must exist."""
    spec = manifest.spec
    if spec.rollout is None:
        raise ManifestError("spec.rollout: local mode runs the rollout executor and the trainer; "
                            "a job without spec.rollout (spec.trainer.workloadRef) runs on a cluster only")
    if spec.model.path is None:
        raise ManifestError("spec.model.path: local mode needs a model directory (spec.model.pvc is for clusters)")
    dataset = resolve(spec.rollout.dataset.path, cwd)
    if not dataset.is_file():
        raise ManifestError(f"spec.rollout.dataset.path: {spec.rollout.dataset.path} does not exist "
                            f"(looked for {dataset}; relative paths are relative to {cwd})")
    model = spec.model.model_copy(update={
        "path": str(resolve(spec.model.path, cwd)),
        "tokenizer": str(resolve(spec.model.tokenizer, cwd)) if spec.model.tokenizer else None,
    })
    rollout = spec.rollout.model_copy(update={
        "dataset": spec.rollout.dataset.model_copy(update={"path": str(dataset)}),
    })
    if spec.rollout.eval is not None and spec.rollout.eval.dataset:
        eval_set = resolve(spec.rollout.eval.dataset, cwd)
        if not eval_set.is_file():
            raise ManifestError(f"spec.rollout.eval.dataset: {spec.rollout.eval.dataset} does not exist (looked for {eval_set})")
        rollout.eval = spec.rollout.eval.model_copy(update={"dataset": str(eval_set)})
    return manifest.model_copy(update={"spec": spec.model_copy(update={"model": model, "rollout": rollout})})


def fetch_model(manifest: RLJobManifest, cache_dir: Path, token: str | None) -> RLJobManifest:
    """spec.model.uri and spec.rollout.dataset.uri downloaded into `cache_dir` (skipped when already
    there), as spec.model.path and spec.rollout.dataset.path.

    Local mode's stand-in for the pods' init container: the same downloader, the token from
    the env file or the shell (HF_TOKEN), the hub from HF_ENDPOINT when set."""
    from rljob_client.fetch import FetchError, fetch_hf, parse_uri

    def download(field: str, uri: str, repo_type: str) -> Path:
        src = parse_uri(uri)
        dest = cache_dir / repo_type / "hf" / src.repo_id / (src.revision or "main")
        try:
            return fetch_hf(src, dest, token=token, endpoint=os.environ.get("HF_ENDPOINT"), repo_type=repo_type)
        except FetchError as e:
            raise ManifestError(f"{field}: {e}") from e

    spec = manifest.spec
    if spec.model.uri is not None:
        path = download("spec.model.uri", spec.model.uri, "model")
        model = spec.model.model_copy(update={"uri": None, "path": str(path), "cache": None, "credentials_secret": None})
        spec = spec.model_copy(update={"model": model})
    dataset = spec.rollout.dataset if spec.rollout is not None else None
    if spec.rollout is not None and dataset is not None and dataset.uri is not None:
        path = download("spec.rollout.dataset.uri", dataset.uri, "dataset") / dataset.path
        local = dataset.model_copy(update={"uri": None, "path": str(path), "credentials_secret": None})
        spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"dataset": local})})
    return manifest.model_copy(update={"spec": spec})


def ensure_model(model_path: str) -> tuple[Path, bool]:
    """The model dir, building the toy's tiny model when it is missing; (path, built)."""
    path = Path(model_path)
    if (path / "config.json").is_file():
        return path, False
    if path.name != TOY_MODEL_DIRNAME:
        raise ManifestError(f"spec.model.path: {path} holds no model (no config.json); point it at a HuggingFace "
                            f"model directory, or at a directory named {TOY_MODEL_DIRNAME} to have the tiny model built")
    from rljob_client.tinymodel import build_tiny_model

    return build_tiny_model(path, seed=0), True


def dump(manifest: RLJobManifest) -> str:
    return yaml.safe_dump(
        {"apiVersion": manifest.api_version, "kind": manifest.kind, "metadata": manifest.metadata,
         "spec": manifest.spec.model_dump(by_alias=True, mode="json")},  # nulls kept: labelField: null means none
        sort_keys=False,
    )
