"""What local mode can run on this machine, and how to scale a manifest down when it cannot.

Pure: the caller measures the machine (available memory) and passes it in, so each refusal
and its message are unit-tested. Every message names the field and the value that would work,
because the person reading it wants to change one line of YAML and run again.
"""

from __future__ import annotations

import math

from controller_runtime.api.spec import Engine, RLJobSpec, WeightUpdateMethod
from rljob_cli.podsettings import pod_settings_problems

GIB = 2**30
BYTES_PER_CPU_ENGINE = int(3.3 * GIB)  # one vLLM CPU server on the tiny model, 1 GiB KV cache
BYTES_FOR_THE_REST = int(1.5 * GIB)  # Ray head + executor actor + the torch trainer
BYTES_PER_EXTRA_TRAINER_RANK = int(0.6 * GIB)  # one more torch process (tiny model, gloo) per rank beyond the first
# Ranks are local processes sharing the cores (one torch thread each): on a 2-core machine 2
# ranks train side by side; 4 still run correctly (the rank tests do), only slower per rank.
MAX_LOCAL_TRAINER_RANKS = 4


class LocalModeError(Exception):
    """The manifest asks for something local mode cannot do; the message says what to change."""


def max_cells(available_bytes: int) -> int:
    return max(0, math.floor((available_bytes - BYTES_FOR_THE_REST) / BYTES_PER_CPU_ENGINE))


def local_mode_problems(spec: RLJobSpec, available_bytes: int) -> list[str]:
    """Everything that stops this spec from running here; empty when it fits."""
    inf, trainer = spec.inference, spec.trainer
    problems: list[str] = []
    if inf.engine != Engine.vllm:
        problems.append(f"spec.inference.engine is {inf.engine}: local mode runs vLLM's CPU build only; set engine: vllm")
    if inf.gpus_per_engine > 0:
        problems.append(
            f"spec.inference.gpusPerEngine is {inf.gpus_per_engine}: local mode runs engines on this machine's CPU "
            "(vLLM CPU build, no GPUs); scale it down: set spec.inference.gpusPerEngine: 0 and spec.inference.replicas: 1"
        )
    if inf.replicas < 1:
        problems.append("spec.inference.replicas is 0: local mode needs at least one engine cell; set replicas: 1")
    extra_ranks = max(0, min(trainer.replicas, MAX_LOCAL_TRAINER_RANKS) - 1)
    need = inf.replicas * BYTES_PER_CPU_ENGINE + BYTES_FOR_THE_REST + extra_ranks * BYTES_PER_EXTRA_TRAINER_RANK
    if inf.replicas >= 1 and need > available_bytes:
        fits = max_cells(available_bytes)
        hint = (f"scale it down: set spec.inference.replicas: {fits}" if fits >= 1
                else "free some memory first (no engine fits now)")
        problems.append(
            f"spec.inference.replicas is {inf.replicas}: that needs about {need / GIB:.1f} GiB "
            f"({BYTES_PER_CPU_ENGINE / GIB:.1f} GiB per CPU engine + {BYTES_FOR_THE_REST / GIB:.1f} GiB for Ray, "
            f"the executor and the trainer"
            + (f" + {BYTES_PER_EXTRA_TRAINER_RANK / GIB:.1f} GiB per trainer rank beyond the first" if extra_ranks else "")
            + f") but {available_bytes / GIB:.1f} GiB is available; {hint} "
            "(and spec.inference.gpusPerEngine: 0)"
        )
    if inf.weight_update.method is WeightUpdateMethod.nccl:
        problems.append(f"spec.inference.weightUpdate.method is {inf.weight_update.method}: local mode runs CPU "
                        "engines; set method: gloo (the same broadcast on CPU) or disk")
    if trainer.workload_ref is not None:
        problems.append("spec.trainer.workloadRef: local mode runs the trainer itself (the reference trainer or "
                        "spec.trainer.command); remove workloadRef")
    if not 1 <= trainer.replicas <= MAX_LOCAL_TRAINER_RANKS:
        problems.append(f"spec.trainer.replicas is {trainer.replicas}: local mode runs 1 to {MAX_LOCAL_TRAINER_RANKS} "
                        "trainer ranks (one local process each); set replicas: 1 or 2")
    if trainer.gpus_per_replica > 0:
        problems.append(f"spec.trainer.gpusPerReplica is {trainer.gpus_per_replica}: local mode trains on the CPU; "
                        "set spec.trainer.gpusPerReplica: 0")
    return problems


def check_local_mode(spec: RLJobSpec, available_bytes: int, env_file: dict[str, str] | None = None) -> None:
    """Refuse, naming every field to change, a spec that cannot run here (machine size, then pod settings)."""
    problems = local_mode_problems(spec, available_bytes) + pod_settings_problems(spec, env_file or {})
    if problems:
        raise LocalModeError("this manifest cannot run in local mode:\n  - " + "\n  - ".join(problems))
