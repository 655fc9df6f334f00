"""The reference trainer as a pod's process: `python -m rljob_client.trainer`.

The operator starts it with `--model --steps --learning-rate --algorithm`, the checkpoint settings
`--save-every --keep-checkpoints` (spec.trainer.reference.saveEverySteps, keepCheckpoints), the
loss settings `--temperature` (spec.rollout.sampling.temperature: the gradient must be for the
policy the engines sample from), `--max-grad-norm` and `--off-policy-mode --clip-eps-low
--clip-eps-high --tis-cap` (spec.trainer.reference; the defaults are the spec's), and the
environment of a trainer pod: RLJOB_CONTROLLER_URL, RLJOB_NAME, RLJOB_NAMESPACE,
RLJOB_ROLLOUT_ADDRESS (Ray Client address of the executor), RLJOB_WEIGHTS_DIR (shared
storage for `disk` weight sync), RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; optionally
RLJOB_CONTROLLER_TOKEN_FILE (else the pod's ServiceAccount token). Ranks average
gradients over gloo; rank 0 writes weights and drives the update window.

A (re)started trainer resumes from the newest checkpoint in `--checkpoint-dir` (default
`<weights-dir>/<job>/checkpoints`): weights in full precision, optimizer, RNG states, and the
executor put back to its dataset position after the checkpoint's step (trainer/resume.py).
No checkpoint there: a first start, unless `--resume` says there must be one; a checkpoint
dir that holds anything unreadable is refused (exit code 2, naming the file). Without
checkpoints (`--save-every 0`) a restart resumes from the controller's weight version if the
weights dir still holds it (bf16 weights, the optimizer state starts afresh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller_runtime.api.spec import (
    Engine,
    MemoryTag,
    OffPolicyMode,
    OffPolicySpec,
    PauseMode,
    ReferenceTrainerSpec,
    WeightUpdateSpec,
)
from controller_runtime.clients.factory import make_engine_client
from rljob_client.controller_client import InferenceControllerClient, default_holder
from rljob_client.ranks import StoreRanks
from rljob_client.trainer.checkpoint import CheckpointError, CheckpointStore
from rljob_client.trainer.evaluation import PolicyEvaluator
from rljob_client.trainer.loop import LoopConfig, StepRecord, ThreadedRolloutStream, TrainingLoop
from rljob_client.trainer.metrics import TrainerMetrics
from rljob_client.weights.disk import DiskWeightWriter

if TYPE_CHECKING:  # the executor's batch type; imported for annotations only
    from rljob_client.wire.trainbatch import TrainBatch

log = logging.getLogger("rljob_client.trainer")

EXIT_BAD_CHECKPOINT = 2


class BatchLog(ThreadedRolloutStream):
    """The executor, with one JSON line per batch received: what each step trained on, to audit a resumed run."""

    def __init__(self, stream: Any, path: Path, rank: int) -> None:
        super().__init__(stream)
        self.path = path
        self.rank = rank

    async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        batch = await super().get(rollout_id, rank, world_size)
        line = {"step": rollout_id, "rank": self.rank, "prompts": sorted({int(i) for i in batch.prompt_indices}),
                "weight_versions": sorted({int(v) for v in batch.weight_versions})}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        return batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m rljob_client.trainer", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=env("RLJOB_MODEL_PATH"), help="initial model directory (HF format)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--algorithm", choices=["grpo", "reinforce"], default="grpo")
    p.add_argument("--save-every", type=int, default=0,
                   help="save a checkpoint every N steps (spec.trainer.reference.saveEverySteps); 0: never")
    p.add_argument("--keep-checkpoints", type=int, default=ReferenceTrainerSpec().keep_checkpoints)
    p.add_argument("--checkpoint-dir", default=env("RLJOB_CHECKPOINT_DIR"),
                   help="where checkpoints go; default <weights-dir>/<job>/checkpoints")
    p.add_argument("--resume", action="store_true",
                   help="refuse to start unless a checkpoint is there to resume from")
    p.add_argument("--batches-file", default=env("RLJOB_BATCHES_FILE"),
                   help="append one JSON line per batch received (step, rank, prompt indices, weight versions)")
    p.add_argument("--weights-dir", default=env("RLJOB_WEIGHTS_DIR", "/checkpoints"))
    p.add_argument("--engine", choices=[e.value for e in Engine], default=env("RLJOB_ENGINE", "vllm"))
    p.add_argument("--pause-mode", choices=[m.value for m in PauseMode], default=env("RLJOB_PAUSE_MODE", "wait"))
    p.add_argument("--offload-tags", default=env("RLJOB_OFFLOAD_TAGS", ""),
                   help="comma-separated tags to offload around training (colocated mode); empty: no offload")
    ref = ReferenceTrainerSpec()
    p.add_argument("--temperature", type=float, default=1.0,
                   help="the engines' sampling temperature (spec.rollout.sampling.temperature)")
    p.add_argument("--max-grad-norm", type=float, default=ref.max_grad_norm, help="0: no gradient clipping")
    p.add_argument("--off-policy-mode", choices=[m.value for m in OffPolicyMode], default=ref.off_policy.mode.value)
    p.add_argument("--clip-eps-low", type=float, default=ref.off_policy.clip_eps_low)
    p.add_argument("--clip-eps-high", type=float, default=ref.off_policy.clip_eps_high)
    p.add_argument("--tis-cap", type=float, default=ref.off_policy.tis_cap)
    p.add_argument("--micro-batch-size", type=int, default=ref.micro_batch_size,
                   help="samples per forward/backward pass, gradients accumulated (0: the whole batch)")
    p.add_argument("--kl-coef", type=float, default=ref.kl_coef, help="KL penalty (k3) against the initial model; 0: off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-file", default=env("RLJOB_METRICS_FILE"),
                   help="append one JSON line per step (rewards, versions, timings) to this file")
    p.add_argument("--eval-file", default=env("RLJOB_EVAL_FILE"),
                   help="append one JSON line per evaluation of the policy (spec.rollout.eval) to this file")
    p.add_argument("--metrics-port", type=int, default=int(env("RLJOB_TRAINER_METRICS_PORT", "0")),
                   help="serve Prometheus /metrics (step time by phase) on this port; 0: off")
    args = p.parse_args(argv)
    if not args.model:
        p.error("--model (or RLJOB_MODEL_PATH) is required")
    try:  # the spec's bounds, so a hand-started trainer is refused as a manifest would be
        args.off_policy = OffPolicySpec(mode=OffPolicyMode(args.off_policy_mode), clip_eps_low=args.clip_eps_low,
                                        clip_eps_high=args.clip_eps_high, tis_cap=args.tis_cap)
    except ValueError as exc:
        p.error(f"off-policy settings: {exc}")
    if args.micro_batch_size < 0 or args.kl_coef < 0:
        p.error("--micro-batch-size and --kl-coef must be >= 0")
    if args.save_every < 0 or args.keep_checkpoints < 1:
        p.error("--save-every must be >= 0 and --keep-checkpoints >= 1")
    if args.temperature < 0 or args.max_grad_norm < 0:
        p.error("--temperature and --max-grad-norm must be >= 0")
    if os.environ.get("RLJOB_WEIGHT_UPDATE_METHOD", "disk") != "disk":
        p.error(f"the reference trainer syncs weights by disk only, not {os.environ['RLJOB_WEIGHT_UPDATE_METHOD']!r}")
    return args


def append_line(path: Path | None, record: dict[str, Any]) -> None:
    """One JSON line onto `path` (the step and eval files `rljob run` reads as they grow)."""
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def init_distributed(rank: int, world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world_size)


async def train(args: argparse.Namespace) -> int:
    from rljob_client.publish import abort_orphan_window
    from rljob_client.rollout_stream import RolloutStream
    from rljob_client.trainer.grpo import OffPolicyCorrection
    from rljob_client.trainer.policy import PolicyTrainer
    from rljob_client.trainer.resume import Checkpointer, resume_from

    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    controller = InferenceControllerClient.from_env(holder=default_holder())
    store = CheckpointStore(args.checkpoint_dir or Path(args.weights_dir) / controller.name / "checkpoints",
                            keep=args.keep_checkpoints)
    try:  # before anything starts: never train over a checkpoint that is there but unreadable
        ckpt = store.resume_point(required=args.resume)
    except CheckpointError as exc:
        log.error("cannot resume: %s", exc)
        await controller.close()
        return EXIT_BAD_CHECKPOINT
    init_distributed(rank, world_size)
    config = LoopConfig(
        steps=args.steps,
        sync_dir=Path(args.weights_dir) / controller.name,
        engine=Engine(args.engine),
        pause_mode=PauseMode(args.pause_mode),
        offload_tags=tuple(MemoryTag(t) for t in args.offload_tags.split(",") if t),
        holder=controller.holder,
        rank=rank,
        world_size=world_size,
        ready_timeout_seconds=float(env_ready) if (env_ready := os.environ.get("RLJOB_READY_TIMEOUT_SECONDS"))
        else WeightUpdateSpec().ready_timeout_seconds,
        overlap=os.environ.get("RLJOB_OVERLAP", "0") == "1",  # generate rollout n+1 while training on n (loop.py)
    )
    writer = DiskWeightWriter(config.sync_dir, args.model, keep=config.keep_versions)
    start_step, model_dir = 0, Path(args.model)
    current = (await controller.cells()).weight_version
    if ckpt is None and current and current.isdigit() and int(current) in writer.versions():
        start_step, model_dir = int(current), writer.path_for(int(current))
        log.info("resuming at step %d from %s", start_step, model_dir)
    policy = PolicyTrainer(model_dir, args.learning_rate, args.algorithm, seed=args.seed,
                           max_grad_norm=args.max_grad_norm, temperature=args.temperature,
                           correction=OffPolicyCorrection.from_spec(args.off_policy),
                           micro_batch_size=args.micro_batch_size, kl_coef=args.kl_coef, reference_dir=args.model)
    stream = RolloutStream(controller.name)
    if ckpt is not None:
        if rank == 0:
            await abort_orphan_window(controller, controller.holder)
        start_step = await resume_from(ckpt, policy, rank=rank, restore_executor=(
            (lambda state: asyncio.to_thread(stream.restore, state)) if rank == 0 else None))
        if world_size > 1:  # no rank asks for a rollout before the executor is back at the checkpoint
            import torch.distributed as dist

            await asyncio.to_thread(dist.barrier)
    ranks = StoreRanks.from_process_group() if world_size > 1 else None
    checkpointer = Checkpointer(store, args.save_every, policy, ranks=ranks,  # every rank: each hands its RNG state
                                executor_state=lambda rollout_id: asyncio.to_thread(stream.checkpoint, rollout_id))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = Path(args.metrics_file) if args.metrics_file else None
    evals = Path(args.eval_file) if args.eval_file else None
    exporter = TrainerMetrics(controller.namespace, controller.name, rank)
    if args.metrics_port:
        exporter.serve(args.metrics_port)

    def on_step(r: StepRecord) -> None:
        log.info("step %d reward %.3f loss %.4f v%d (%.2f s)", r.step, r.reward_mean, r.loss, r.weight_version,
                 r.step_seconds)
        append_line(metrics, r.to_dict())
        exporter.step_done(r.step, r.rollout_seconds, r.train_seconds, r.sync_seconds, r.reward_mean)
        checkpointer.after_step(r)

    training = TrainingLoop(
        config, controller, BatchLog(stream, Path(args.batches_file), rank) if args.batches_file
        else ThreadedRolloutStream(stream), policy,
        lambda endpoint: make_engine_client(config.engine, endpoint), writer=writer, on_step=on_step,
        ranks=ranks,
    )
    if rank == 0:  # the writer evaluates when spec.rollout.eval asks (everySteps comes from the executor)
        training.evaluator = await asyncio.to_thread(PolicyEvaluator.from_stream, stream, args.steps,
                                                     lambda v: str(writer.path_for(v)),
                                                     lambda point: append_line(evals, point.to_dict()))
    try:
        await training.run(stop, start_step=start_step)
        await checkpointer.close()
    finally:
        await controller.close()
        stream.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(train(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
