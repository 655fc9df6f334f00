"""The environment a trainer process gets, from the operator's trainer pods and from `rljob run` alike.

One table: each field, its variable and its default. `JobEnv.read` fails naming the variable
that is missing or malformed, so a trainer started by hand says what it lacks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from rljob_client.errors import RLJobError


class EnvError(RLJobError, ValueError):
    """A variable the SDK needs is missing or malformed."""


@dataclass(frozen=True)
class JobEnv:
    name: str  # RLJOB_NAME: the RLJob (the executor's actor and the controller's job)
    namespace: str  # RLJOB_NAMESPACE
    controller_url: str  # RLJOB_CONTROLLER_URL: the controller API
    rollout_address: str  # RLJOB_ROLLOUT_ADDRESS: Ray Client address of the executor
    model_path: Path  # RLJOB_MODEL_PATH: the model the engines were started with (version 0)
    weights_dir: Path  # RLJOB_WEIGHTS_DIR: shared storage for `disk` weight sync and checkpoints
    weight_update_method: str = "disk"  # RLJOB_WEIGHT_UPDATE_METHOD: disk | gloo | nccl
    engine: str = "vllm"  # RLJOB_ENGINE
    pause_mode: str = "wait"  # RLJOB_PAUSE_MODE
    ready_timeout_seconds: float = 0.0  # RLJOB_READY_TIMEOUT_SECONDS: 0 waits for no starting cell
    offload_tags: str = ""  # RLJOB_OFFLOAD_TAGS: colocated trainers offload these around training
    rank: int = 0  # RANK
    world_size: int = 1  # WORLD_SIZE
    steps: int = 0  # RLJOB_STEPS: steps of the job (0: the trainer passes them to job.batches())
    metrics_file: str = ""  # RLJOB_METRICS_FILE: one JSON line per job.report() (local mode reads it)
    bucket_megabytes: int = 512  # RLJOB_BUCKET_MEGABYTES: streaming export's bucket size

    @property
    def job_weights_dir(self) -> Path:
        """Where this job's versions go: `<weights dir>/<job>`."""
        return self.weights_dir / self.name


ENV: dict[str, str] = {
    "name": "RLJOB_NAME", "namespace": "RLJOB_NAMESPACE", "controller_url": "RLJOB_CONTROLLER_URL",
    "rollout_address": "RLJOB_ROLLOUT_ADDRESS", "model_path": "RLJOB_MODEL_PATH", "weights_dir": "RLJOB_WEIGHTS_DIR",
    "weight_update_method": "RLJOB_WEIGHT_UPDATE_METHOD", "engine": "RLJOB_ENGINE", "pause_mode": "RLJOB_PAUSE_MODE",
    "ready_timeout_seconds": "RLJOB_READY_TIMEOUT_SECONDS", "offload_tags": "RLJOB_OFFLOAD_TAGS", "rank": "RANK",
    "world_size": "WORLD_SIZE", "steps": "RLJOB_STEPS", "metrics_file": "RLJOB_METRICS_FILE",
    "bucket_megabytes": "RLJOB_BUCKET_MEGABYTES",
}


def read(environ: Mapping[str, str] | None = None) -> JobEnv:
    """The JobEnv of `environ` (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for f in fields(JobEnv):
        var = ENV[f.name]
        raw = environ.get(var)
        if raw is None or raw == "":
            if f.default is MISSING:
                raise EnvError(f"{var} is not set: the trainer needs the environment of a trainer pod "
                               "(the operator and `rljob run` set it)")
            continue
        kind = {"int": int, "float": float, "Path": Path}.get(str(f.type), str)
        try:
            values[f.name] = kind(raw)
        except ValueError as exc:
            raise EnvError(f"{var}={raw!r}: not a valid {kind.__name__}") from exc
    env = JobEnv(**values)  # type: ignore[arg-type]
    if not 0 <= env.rank < env.world_size:
        raise EnvError(f"RANK={env.rank} must be in [0, WORLD_SIZE={env.world_size})")
    return env
