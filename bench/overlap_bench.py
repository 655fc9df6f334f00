"""Generation overlapped with training vs synchronous steps, and the weight window per fleet size.

    .venv/bin/python bench/overlap_bench.py [--steps 30] [--cells 1 2 4] [--json-out FILE]
    .venv/bin/python bench/overlap_bench.py --smoke        # seconds: CI

Real mode runs the tiny job (examples/tiny-cpu.yaml: real vLLM CPU engine, executor, reference
trainer) with `rljob run` twice in one invocation, synchronous then overlapped (LoopConfig.overlap:
the writer starts rollout n+1 before training on n), same seed and same number of steps (so
the same number of samples), and reports for each the mean and median step time, samples/s
(samples trained / the sum of step times: the job's start-up is not counted) and the reward curve
over those samples, and the ratio of samples/s (target >= 1.3 for overlapped).

Then the window time (the controller's `window_opened` -> `weights_updated` in its audit log:
start_update_weights to end_update_weights, every engine pushed at once) for 1, 2 and 4 engine
cells: the synchronous run gives 1 cell, a short run of the same job with spec.inference.replicas
2 (and 4) the others. Each real vLLM CPU cell takes about 3.5 GiB: 4 cells run only when more
than 16 GiB is available, else the result says why they were left out.

--smoke runs the real TrainingLoop against the real InferenceController on the fakes, with an
executor stand-in whose rollouts take a fixed time to generate and a policy whose steps take a
fixed time to train: the same two modes and the same report, in a few seconds.

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "tiny-cpu.yaml"
GIB = 2**30
FOUR_CELLS_NEED_BYTES = 16 * GIB
TARGET_RATIO = 1.3

RUN = r"""
import os, sys
from pathlib import Path
if os.environ.get("RLJOB_BENCH_CPUS"):  # the run and its children (executor, Ray, trainer) on these cores
    os.sched_setaffinity(0, {int(c) for c in os.environ["RLJOB_BENCH_CPUS"].split(",")})
from rljob_cli.run import RunOptions, run
manifest, out, steps, overlap = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.exit(run(RunOptions(manifest=Path(manifest), out=Path(out), steps=steps, cwd=Path(sys.argv[5]),
                        overlap={"on": True, "off": False}[overlap])))
"""


def mode_report(per_step: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [float(r["step_seconds"]) for r in per_step]
    samples = sum(int(r["samples"]) for r in per_step)
    rewards = [round(float(r["reward_mean"]), 4) for r in per_step]
    return {
        "steps": len(per_step),
        "samples": samples,
        "mean_step_seconds": statistics.fmean(steps) if steps else None,
        "median_step_seconds": statistics.median(steps) if steps else None,
        "samples_per_second": samples / sum(steps) if steps else None,
        "mean_rollout_wait_seconds": statistics.fmean(float(r["rollout_seconds"]) for r in per_step) if steps else None,
        "mean_train_seconds": statistics.fmean(float(r["train_seconds"]) for r in per_step) if steps else None,
        "mean_sync_seconds": statistics.fmean(float(r["sync_seconds"]) for r in per_step) if steps else None,
        "rewards": rewards,
        "first5_mean_reward": statistics.fmean(rewards[:5]) if rewards else None,
        "last5_mean_reward": statistics.fmean(rewards[-5:]) if rewards else None,
        "batch_weight_versions": [r.get("batch_weight_versions") for r in per_step],
    }


def compare(sync: dict[str, Any], overlap: dict[str, Any]) -> dict[str, Any]:
    ratio = (overlap["samples_per_second"] / sync["samples_per_second"]
             if overlap["samples_per_second"] and sync["samples_per_second"] else None)
    return {
        "samples_per_second_ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio is not None and ratio >= TARGET_RATIO,
        "same_samples": sync["samples"] == overlap["samples"],
        "last5_reward_delta": (overlap["last5_mean_reward"] - sync["last5_mean_reward"]
                               if overlap["last5_mean_reward"] is not None and sync["last5_mean_reward"] is not None
                               else None),
    }


# ---- real mode ---------------------------------------------------------------------------------

def split_env(split: str | None) -> dict[str, str]:
    """`--split-cores ENGINE:REST` as environment: vLLM's compute threads bound to ENGINE, every
    other process of the run (trainer, executor, Ray, controller, vLLM's front end) on REST."""
    if not split:
        return {}
    engine, rest = split.split(":")
    return {"VLLM_CPU_OMP_THREADS_BIND": engine, "RLJOB_BENCH_CPUS": rest}


def run_job(manifest: Path, out: Path, steps: int, overlap: bool, trainer_threads: int = 0,
            split: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(trainer_threads)} if trainer_threads else {}), **split_env(split))
    proc = subprocess.run([sys.executable, "-c", RUN, str(manifest), str(out), str(steps), "on" if overlap else "off",
                           str(ROOT)], cwd=ROOT, capture_output=True, text=True, env=env)
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        raise RuntimeError(f"rljob run {manifest.name} (overlap {overlap}) exited {proc.returncode}:\n"
                           + "\n".join(proc.stderr.splitlines()[-30:]))
    summary = json.loads(summary_path.read_text())
    summary["wall_seconds"] = time.monotonic() - started
    summary["load_average_after"] = os.getloadavg()[0]  # others' work on a shared machine shows here
    return summary


def window_seconds(out: Path) -> list[float]:
    """window_opened -> weights_updated of each completed window, from the controller's audit log."""
    opened: float | None = None
    times: list[float] = []
    for path in sorted((out / "logs").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            at = datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00")).timestamp()
            if rec.get("type") == "window_opened":
                opened = at
            elif rec.get("type") in ("weights_updated", "window_aborted") and opened is not None:
                if rec["type"] == "weights_updated":
                    times.append(at - opened)
                opened = None
    return times


def window_report(times: list[float]) -> dict[str, Any]:
    later = times[1:] or times  # the first window waits for the fleet to come up
    return {"windows": len(times), "median_seconds": statistics.median(later) if later else None,
            "max_seconds": max(later) if later else None}


def cells_manifest(tmp: Path, cells: int) -> Path:
    data = yaml.safe_load(TINY.read_text())
    data["metadata"]["name"] = f"tiny-cpu-{cells}cells"
    data["spec"]["inference"]["replicas"] = cells
    path = tmp / f"tiny-cpu-{cells}cells.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def real(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="overlap-bench-"))
    order = (("sync", False), ("overlap", True))
    runs = {name: run_job(TINY, tmp / name, args.steps, overlap, args.trainer_threads, args.split_cores)
            for name, overlap in (order[::-1] if args.overlap_first else order)}
    modes = {name: mode_report(s["per_step"]) for name, s in runs.items()}
    windows: dict[str, Any] = {"1": window_report(window_seconds(tmp / "sync"))}
    skipped: dict[str, str] = {}
    for cells in (c for c in args.cells if c > 1):
        available = psutil.virtual_memory().available
        if cells >= 4 and available <= FOUR_CELLS_NEED_BYTES:
            skipped[str(cells)] = (f"{available / GIB:.1f} GiB available, 4 vLLM CPU cells need about 3.5 GiB each: "
                                   f"more than {FOUR_CELLS_NEED_BYTES // GIB} GiB available is required")
            continue
        out = tmp / f"cells{cells}"
        run_job(cells_manifest(tmp, cells), out, args.window_steps, False)
        windows[str(cells)] = window_report(window_seconds(out))
    return {"bench": "overlap", "mode": "real", "job": str(TINY.relative_to(ROOT)), "steps": args.steps,
            "trainer_threads": args.trainer_threads or None, "split_cores": args.split_cores,
            "order": list(runs),
            "load_average_after": {name: s["load_average_after"] for name, s in runs.items()}, "modes": modes, **compare(modes["sync"], modes["overlap"]), "window_by_cells": windows,
            "window_cells_skipped": skipped, "out": str(tmp),
            "wall_seconds": {name: s["wall_seconds"] for name, s in runs.items()}}


# ---- smoke mode ----------------------------------------------------------------------------------

async def smoke_mode(overlap: bool, steps: int, generate_s: float, train_s: float, tmp: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from rljob_client.controller_client import LocalControllerClient
    from rljob_client.trainer.loop import LoopConfig, TrainingLoop
    from rljob_client.trainer.policy import StepMetrics
    from rljob_client.wire.trainbatch import TrainBatch

    from controller_runtime.api.spec import InferenceSpec
    from controller_runtime.clock import FakeClock
    from controller_runtime.controller import InferenceController
    from controller_runtime.fakes import FakeEngines, FakePlatform, settle

    n = 64

    class Executor:
        """Rollouts that take `generate_s` to generate, started by generate() or get()."""

        def __init__(self) -> None:
            self.tasks: dict[int, asyncio.Task[None]] = {}
            self.version = 0

        def _start(self, rollout_id: int) -> asyncio.Task[None]:
            if rollout_id not in self.tasks:
                self.tasks[rollout_id] = asyncio.ensure_future(asyncio.sleep(generate_s))
            return self.tasks[rollout_id]

        async def generate(self, rollout_id: int) -> None:
            self._start(rollout_id)

        async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
            await self._start(rollout_id)
            rewards = np.random.default_rng(rollout_id).random(n).astype(np.float32)
            return TrainBatch(arrays={
                "tokens": np.zeros((n, 3), np.int32), "response_mask": np.ones((n, 3), np.uint8),
                "prompt_lengths": np.ones(n, np.int32), "response_lengths": np.full(n, 2, np.int32),
                "rewards": rewards, "group_indices": np.arange(n, dtype=np.int32) // 8,
                "weight_versions": np.full(n, self.version, np.int64),
            }, rollout_id=rollout_id)

        async def set_weight_version(self, version: int) -> None:
            self.version = version

        async def begin_weight_update(self) -> dict[str, Any]:
            return {"mode": "drain", "in_flight": 0}

        async def end_weight_update(self, version: int | None = None) -> int:
            return self.version if version is None else version

    class Policy:
        def __init__(self, model_dir: Path) -> None:
            self.model = torch.nn.Linear(2, 2)
            self.model_dir = model_dir

        def train_step(self, b: TrainBatch) -> StepMetrics:
            time.sleep(train_s)  # the trainer's compute: a thread, as the real one
            return StepMetrics(0.0, float(np.mean(b.rewards)), float(np.std(b.rewards)), len(b), 2 * n, 1.0, train_s)

    spec = InferenceSpec.model_validate({"replicas": 1, "gpusPerEngine": 0, "restartPolicy": {"backoffSeconds": 0}})
    controller = InferenceController("bench", spec, FakePlatform(), (engines := FakeEngines()), clock=FakeClock(),
                                     serve_initial_weights=True)
    model = tmp / f"model-{overlap}"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = LoopConfig(steps=steps, sync_dir=tmp / f"sync-{overlap}", retry_seconds=0.001, rejoin_check_seconds=0.05)
    policy: Any = Policy(model)  # the loop needs only .model, .model_dir and train_step
    loop = TrainingLoop(replace(config, overlap=overlap), LocalControllerClient(controller, holder="bench"), Executor(),
                        policy, engines)
    stop = asyncio.Event()

    async def drive() -> None:
        while not stop.is_set():
            await settle(controller, 1)
            await asyncio.sleep(0.002)

    driver = asyncio.create_task(drive())
    try:
        records = await loop.run()
    finally:
        stop.set()
        await driver
    return mode_report([r.to_dict() for r in records])


def smoke(args: argparse.Namespace) -> dict[str, Any]:
    steps, generate_s, train_s = 6, 0.25, 0.25
    with tempfile.TemporaryDirectory(prefix="overlap-bench-smoke-") as tmp:
        modes = {name: asyncio.run(smoke_mode(overlap, steps, generate_s, train_s, Path(tmp)))
                 for name, overlap in (("sync", False), ("overlap", True))}
    return {"bench": "overlap", "mode": "smoke", "steps": steps, "generate_seconds": generate_s,
            "train_seconds": train_s, "modes": modes, **compare(modes["sync"], modes["overlap"])}


def summary_line(result: dict[str, Any]) -> str:
    m = result["modes"]
    parts = [f"{name} {m[name]['median_step_seconds']:.2f} s/step {m[name]['samples_per_second']:.1f} samples/s"
             for name in ("sync", "overlap")]
    parts.append(f"ratio {result['samples_per_second_ratio']:.2f}x (target {TARGET_RATIO}x)")
    parts.append(f"last5 reward sync {m['sync']['last5_mean_reward']:.3f} overlap {m['overlap']['last5_mean_reward']:.3f}")
    for cells, w in result.get("window_by_cells", {}).items():
        if w["median_seconds"] is not None:
            parts.append(f"window {cells} cell(s) {w['median_seconds']:.2f} s")
    for cells in result.get("window_cells_skipped", {}):
        parts.append(f"{cells} cells skipped (memory)")
    return f"overlap_bench ({result['mode']}): " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="simulated generation and training: seconds, for CI")
    p.add_argument("--steps", type=int, default=30, help="steps per mode (the same samples in both)")
    p.add_argument("--cells", type=int, nargs="+", default=[1, 2, 4], help="fleet sizes for the window time")
    p.add_argument("--window-steps", type=int, default=4, help="steps of each extra fleet-size run")
    p.add_argument("--trainer-threads", type=int, default=0,
                   help="OMP_NUM_THREADS of the local run's in-process trainer, both modes (0: torch's default)")
    p.add_argument("--split-cores", metavar="ENGINE:REST",
                   help="e.g. 0:1: vLLM's compute threads on core 0, the rest of the run on core 1, both modes")
    p.add_argument("--overlap-first", action="store_true",
                   help="run the overlapped mode first (on a shared machine, to see the load's drift between modes)")
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    result = smoke(args) if args.smoke else real(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
