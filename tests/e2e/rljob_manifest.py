"""The RLJob the e2e tests apply: examples/llama-8b-8gpu.yaml, adjusted to the test cluster.

Kept as close to the shipped example as the test cluster allows; every change says why:
- the model, dataset and checkpoint PVCs are dropped: the test cluster has no storage
  provisioner, and a pod with an unbound claim is never scheduled. The model becomes a
  relative path (passed to the engine unmounted);
- engine pods carry `testcluster.rljob.io/run=process` (spec.inference.podMetadata) so the
  process agent runs them, and `PYTHONPATH=tests/engine_standin` with
  `RLJOB_STANDIN_CELLS=all` (spec.inference.env) so the builder's unchanged command
  `python -m vllm.entrypoints.openai.api_server ...` starts the light stand-in engine
  (tests/engine_standin/rljob_engine_standin.py) instead of vLLM; PATH starts with
  this venv so that `python` is the venv's (see conftest.venv_path_env);
- health every 1 s with a threshold of 2, restart backoff 1 s: seconds, not minutes;
- the trainer is a workload the user runs (`spec.trainer.workloadRef`): the test plays the
  trainer itself through the controller API, and kwok would "complete" a trainer Job's
  simulated pods at once, which would end the job as Succeeded.
The fleet shape is the example's: 4 cells x 2 GPUs on 8-GPU nodes, the GPU toleration and
node selector, vLLM engine args.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import venv_path_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama-8b-8gpu.yaml"
STANDIN_DIR = "tests/engine_standin"  # relative: the agent runs pods from the repository root


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def e2e_rljob(**inference_overrides: Any) -> dict[str, Any]:
    job = copy.deepcopy(example())
    spec = job["spec"]
    spec["model"] = {"path": "models/Llama-3.1-8B-Instruct"}
    inf = spec["inference"]
    inf["podMetadata"] = {"labels": {"testcluster.rljob.io/run": "process"}}
    inf["env"] = [{"name": "PYTHONPATH", "value": STANDIN_DIR}, {"name": "RLJOB_STANDIN_CELLS", "value": "all"},
                  venv_path_env()]
    inf["healthCheck"] = {"intervalSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2,
                          "startupDeadlineSeconds": 120}
    inf["restartPolicy"] = {"backoffSeconds": 1, "maxBackoffSeconds": 5, "maxRestarts": 5}
    inf["weightUpdate"].pop("pvc", None)
    inf.update(inference_overrides)
    spec["rollout"]["dataset"].pop("pvc", None)
    spec["trainer"] = {
        "serviceAccountName": "rljob-trainer",
        "workloadRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama-8b-trainer"},
    }
    return job
