"""`rljob run MANIFEST`: the whole RL loop on one machine, driven by the same controller as on Kubernetes.

What runs where:

- this process: the InferenceController (controller_runtime, unchanged) over a
  `LocalPlatform` whose cells are vLLM CPU processes, driven by `InferenceController.run`:
  the same bounded passes (`run_pass`) that the operator's daemon drives; the controller API
  on 127.0.0.1 for the executor; the reference trainer (in-process, `LocalControllerClient`),
  which reads batches from the executor's actor over Ray Client, as a trainer pod does;
- child process `python -m rollout_executor`: starts a local Ray head and the job's executor
  actor, finds serving engines through the controller API, exactly as in its pod;
- child processes: one vLLM server per engine cell, started, probed, restarted by the controller.

Order of shutdown (normal end, error, Ctrl-C/SIGTERM alike): trainer, executor (it stops its
Ray head), controller loop, engines; then every process recorded in `pids.json` that is
still there is killed. The summary and reward curve are written whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rljob_client.controller_client import LocalControllerClient
from rljob_client.trainer.evaluation import EvalPoint, PolicyEvaluator
from rljob_client.trainer.loop import (
    LoopConfig,
    StepRecord,
    ThreadedRolloutStream,
    TrainingLoop,
    default_overlap,
)
from rljob_client.trainer.metrics import TrainerMetrics

from controller_runtime.api.spec import RLJobManifest, RLJobSpec
from controller_runtime.api.status import CellState
from controller_runtime.audit import AuditLog
from controller_runtime.clients.factory import make_engine_client
from controller_runtime.clock import sleep_or_stop
from controller_runtime.controller import InferenceController
from rljob_cli import report
from rljob_cli.capacity import LocalModeError, check_local_mode
from rljob_cli.children import ChildProcesses
from rljob_cli.local_api import LocalControlAPI
from rljob_cli.local_platform import LocalPlatform, VLLMLauncher
from rljob_cli.manifest import (
    ManifestError,
    dump,
    ensure_model,
    fetch_model,
    job_name,
    load_manifest,
    resolve_paths,
)
from rljob_cli.podsettings import EnvFileError, parse_env_file, process_env
from rljob_cli.progress import Progress
from rljob_cli.vllm_process import die_with_parent, free_port

log = logging.getLogger("rljob")

LOCAL_NAMESPACE = "local"
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130
WATCH_SECONDS = 2.0  # how often the watchdog looks at the executor and the engine cells


TRAINER_RESTARTS = 3  # a trainer process killed by SIGKILL is started again this often (--trainer-process)


class RunFailed(Exception):
    """The run could not continue (an engine that never came up, the executor died, ...)."""


@dataclass(frozen=True)
class RunOptions:
    manifest: Path
    out: Path
    steps: int | None = None
    cwd: Path = Path(".")
    executor_ready_timeout: float = 300.0
    trainer_process: bool = False  # run `python -m rljob_client.trainer` over HTTP, as in a pod
    overlap: bool | None = None  # generate rollout n+1 while training on n; None: the spec's default (loop.py)
    metrics_port: int = 0  # serve the trainer's Prometheus metrics on 127.0.0.1:PORT (0: off)
    env_file: Path | None = None  # NAME=value lines: the values of env entries that read a Secret or ConfigMap
    cache_dir: Path = Path.home() / ".cache" / "rljob"  # where spec.model.uri and dataset.uri are downloaded


@dataclass(frozen=True)
class Prepared:
    """A manifest that local mode can run: validated, checked against this machine, paths absolute."""

    manifest: RLJobManifest
    job: str
    steps: int
    model_built: bool
    env_file: dict[str, str]


def prepare(opts: RunOptions) -> Prepared:
    """Everything that can fail before a process is started (exit code 2 with a message)."""
    manifest = load_manifest(opts.manifest)
    env_file = read_env_file(opts.env_file)
    check_local_mode(manifest.spec, psutil.virtual_memory().available, env_file)
    token = env_file.get("HF_TOKEN") or os.environ.get("HF_TOKEN")
    manifest = fetch_model(manifest, opts.cache_dir, token)
    manifest = resolve_paths(manifest, opts.cwd.resolve())
    assert manifest.spec.model.path is not None
    _, built = ensure_model(manifest.spec.model.path)
    steps = opts.steps if opts.steps is not None else manifest.spec.trainer.reference.steps
    if steps < 1:
        raise ManifestError("--steps must be at least 1")
    return Prepared(manifest, job_name(manifest, opts.manifest), steps, built, env_file)


def read_env_file(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        return parse_env_file(path.read_text(), str(path))
    except OSError as e:
        raise ManifestError(f"--env-file {path}: {e.strerror}") from e
    except EnvFileError as e:
        raise ManifestError(str(e)) from e


def start_logged(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child in its own session (one killpg stops it whole; Ctrl-C reaches only us), output to a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logf:
        return subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)


class ExecutorProcess:
    """`python -m rollout_executor` in its own process group; it owns its Ray head."""

    def __init__(self, job: str, manifest_path: Path, controller_url: str, token_path: Path, out: Path) -> None:
        self.job = job
        self.ready_file = out / "executor-ready.json"
        self.log_path = out / "logs" / "executor.log"
        self.ray_temp = Path(tempfile.mkdtemp(prefix="rj", dir="/tmp"))  # Ray's socket paths must stay short
        self.argv = [
            sys.executable, "-m", "rollout_executor",
            "--job", job, "--namespace", LOCAL_NAMESPACE, "--manifest", str(manifest_path),
            "--controller-url", controller_url, "--token-path", str(token_path),
            "--node-ip", "127.0.0.1", "--client-port", str(free_port()), "--gcs-port", str(free_port()),
            "--data-port", "0", "--num-cpus", "2", "--ray-temp-dir", str(self.ray_temp),
            "--state-dir", str(out / "executor-state"), "--ready-file", str(self.ready_file),
            "--exit-with-parent",  # with die_with_parent: a SIGKILLed runner takes the executor along
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        self.ready_file.unlink(missing_ok=True)
        self.proc = start_logged(self.argv, self.log_path)
        return self.proc.pid

    def log_tail(self, n: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    async def wait_ready(self, within_s: float) -> dict[str, Any]:
        assert self.proc is not None
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RunFailed(f"the executor exited with code {self.proc.returncode} before it was ready "
                                f"(log: {self.log_path}):\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                return json.loads(self.ready_file.read_text())
            await asyncio.sleep(0.5)
        raise RunFailed(f"the executor was not ready within {within_s:g} s (log: {self.log_path}):\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM lets it kill its actor and stop its Ray head; then its group is killed."""
        if self.proc is not None:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=grace)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        shutil.rmtree(self.ray_temp, ignore_errors=True)


class LocalRun:
    def __init__(self, opts: RunOptions, prepared: Prepared) -> None:
        self.opts = opts
        self.prepared = prepared
        self.spec = prepared.manifest.spec
        self.job = prepared.job
        self.out = opts.out.resolve()
        self.logs = self.out / "logs"
        self.children = ChildProcesses(self.out / "pids.json")
        self.stop = asyncio.Event()
        self.interrupted: str | None = None
        self.failure: str | None = None
        self.records: list[StepRecord] = []
        self.evals: list[EvalPoint] = []  # spec.rollout.eval's points (in-process trainer)
        self.last_eval_status: dict[str, Any] | None = None  # the controller's status.lastEval at the end
        self.timings: dict[str, float] = {}
        self.started = time.monotonic()
        self.trainer_metrics = TrainerMetrics(LOCAL_NAMESPACE, self.job, 0)
        if opts.metrics_port:  # the executor's are on its data channel: `data_url` + /metrics
            self.trainer_metrics.serve(opts.metrics_port, "127.0.0.1")

    # -- setup ---------------------------------------------------------------------------------

    def _prepare_out(self) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "reward_curve.png", "executor-ready.json"):
            (self.out / stale).unlink(missing_ok=True)
        shutil.rmtree(self.out / "weights", ignore_errors=True)  # versions of an earlier run
        shutil.rmtree(self.out / "executor-state", ignore_errors=True)
        resolved = self.out / "manifest.resolved.yaml"
        resolved.write_text(dump(self.prepared.manifest))
        return resolved

    def _on_signal(self, signame: str) -> None:
        if self.interrupted is None:
            self.interrupted = signame
            self.progress.write(f"{signame}: stopping (engines, executor, Ray); again to hurry")
            self.stop.set()
        else:
            self.progress.write(f"{signame} again: killing child processes now")
            for r in self.children.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(r["pid"], signal.SIGKILL)

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> int:
        resolved = self._prepare_out()
        inf = self.spec.inference
        engine = inf.engine
        model = self.spec.model.path
        assert model is not None
        self.platform = LocalPlatform(
            VLLMLauncher(model, self.logs, tokenizer=self.spec.model.tokenizer, extra_args=inf.engine_args,
                         env=process_env("inference", inf.env, self.prepared.env_file)[0]),
            on_spawn=self.children.note,
        )
        self.controller = InferenceController(
            self.job, inf, self.platform, lambda endpoint: make_engine_client(engine, endpoint),
            audit=AuditLog(self.logs, self.job), on_event=lambda e: self.progress.event(e),
            serve_initial_weights=True, poll_seconds=2.0,
        )
        self.progress = Progress(self.prepared.steps, self.controller.engine_statuses)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig.name)
        if self.prepared.model_built:
            self.progress.write(f"built the tiny model in {model}")
        ctrl_stop = asyncio.Event()
        ctrl_task = asyncio.create_task(self.controller.run(ctrl_stop), name="controller")
        api = LocalControlAPI(self.controller, self.job, LOCAL_NAMESPACE, self.out / "controller.token")
        self.executor: ExecutorProcess | None = None
        executor: ExecutorProcess | None = None
        stream: Any = None
        watchdog = asyncio.create_task(self._watch(), name="watchdog")
        try:
            url = await api.start()
            executor = self.executor = ExecutorProcess(self.job, resolved, url, api.token_file, self.out)
            self.children.note("executor", executor.start())
            self.progress.status("starting engines, Ray and the executor")
            ready = await self._until_stopped(executor.wait_ready(self.opts.executor_ready_timeout))
            self.timings["executor_ready_seconds"] = time.monotonic() - self.started
            self.children.snapshot()
            if self.opts.trainer_process or self.spec.trainer.replicas > 1 or self.spec.trainer.command:
                # ranks: one process each, gloo; a trainer of your own always runs as its own process
                await self._until_stopped(self._run_trainer_process(ready, api))
                return self._exit_code()
            stream = await self._until_stopped(asyncio.to_thread(self._connect, ready["client_address"]))
            from rljob_client.trainer.policy import PolicyTrainer

            policy = await asyncio.to_thread(PolicyTrainer.from_spec, model, self.spec)
            config = LoopConfig.from_spec(self.spec, steps=self.prepared.steps, sync_dir=self.out / "weights",
                                          holder="local-trainer", overlap=self.opts.overlap)
            training = TrainingLoop(
                config, LocalControllerClient(self.controller, holder="local-trainer"),
                ThreadedRolloutStream(stream), policy, lambda endpoint: make_engine_client(engine, endpoint),
                on_step=self._on_step, on_status=self.progress.status,
            )
            training.evaluator = await asyncio.to_thread(
                PolicyEvaluator.from_stream, stream, self.prepared.steps,
                lambda v: str(training.writer.path_for(v)) if training.writer is not None else None, self._on_eval)
            await self._until_stopped(self._first_sync_timed(training))
            await self._until_stopped(training.run(self.stop, start_step=0, initial_sync=False))
            return self._exit_code()
        except _Stopped:
            return self._exit_code()
        except RunFailed as exc:
            self.failure = str(exc)
            return EXIT_FAILED
        except Exception as exc:
            log.exception("local run failed")
            self.failure = f"{type(exc).__name__}: {exc}"
            return EXIT_FAILED
        finally:
            watchdog.cancel()
            self.progress.status("shutting down")
            await self._shutdown(executor, stream, api, ctrl_stop, ctrl_task)

    async def _run_trainer_process(self, ready: dict[str, Any], api: LocalControlAPI) -> None:
        """The pod's trainer as a child: HTTP controller client, Ray Client to the executor.

        Steps come back through its metrics file (one JSON line each) for the progress display
        and the summary. On a stop it gets SIGTERM and ends after the step in progress. Killed
        (SIGKILL, as the OOM killer or an evicted pod's would be), it is started again, up to
        TRAINER_RESTARTS times, and resumes from its last checkpoint; the steps it redoes
        replace their first attempt in the summary.

        With spec.trainer.replicas > 1, one process per rank (RANK/WORLD_SIZE, a gloo group on
        loopback, one torch thread each: the ranks share this machine's cores), as the pods of a
        trainer Job would be; the summary takes rank 0's steps. A rank killed with SIGKILL brings
        the others down (the rank discipline fails them naming it), and all start again together.
        """
        ref = self.spec.trainer.reference
        metrics, evals = self.out / "trainer-steps.jsonl", self.out / "trainer-evals.jsonl"
        batches = self.out / "trainer-batches.jsonl"
        for path in (metrics, evals, batches):
            path.unlink(missing_ok=True)
        env = trainer_env(self.spec, self.job, self.out, self.prepared.steps, api.url, str(api.token_file),
                          ready["client_address"], metrics,
                          self.opts.overlap if self.opts.overlap is not None else default_overlap(self.spec))
        env.update(process_env("trainer", self.spec.trainer.env, self.prepared.env_file)[0])
        world = self.spec.trainer.replicas
        if self.spec.trainer.command:
            argv = local_command([*self.spec.trainer.command, *self.spec.trainer.args])
        else:
            argv = [sys.executable, "-m", "rljob_client.trainer", "--model", str(self.spec.model.path),
                    "--steps", str(self.prepared.steps), "--learning-rate", repr(ref.learning_rate),
                    "--algorithm", ref.algorithm, "--weights-dir", str(self.out / "weights"),
                    "--engine", str(self.spec.inference.engine),
                    "--pause-mode", str(self.spec.inference.weight_update.pause_mode), "--metrics-file", str(metrics),
                    "--eval-file", str(evals), "--batches-file", str(batches), *ref.checkpoint_flags(),
                    *ref.loss_flags(self.spec.executor.sampling.temperature)]
        log_path = self.logs / "trainer.log"
        seen, seen_evals, restarts = 0, 0, 0
        while True:
            if world > 1:
                env.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
                env.setdefault("OMP_NUM_THREADS", "1")
            procs = [start_logged(argv if rank == 0 else rank_argv(argv, rank), rank_path(log_path, rank),
                                  dict(env, RANK=str(rank), POD_NAME=f"trainer-{rank}")) for rank in range(world)]
            for p in procs:
                self.children.note("trainer", p.pid)
            what = " ".join(argv[1:3]) if self.spec.trainer.command else "python -m rljob_client.trainer"
            self.progress.status(f"{world} trainer process{'es' if world > 1 else ''} started ({what})")
            try:
                while True:
                    records, seen = new_json_lines(metrics, seen)
                    for record in [StepRecord(**line) for line in records]:
                        self.records = [r for r in self.records if r.step < record.step]  # redone after a resume
                        self._on_step(record)
                    points, seen_evals = new_json_lines(evals, seen_evals)
                    for point in [EvalPoint(**line) for line in points]:
                        self.evals = [e for e in self.evals if e.step < point.step]  # redone after a resume
                        self._on_eval(point)
                    if all(p.poll() is not None for p in procs):
                        break
                    await asyncio.sleep(0.5)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        await asyncio.to_thread(p.wait, 60)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, signal.SIGKILL)
            # the rank to report: one killed by SIGKILL, else the first that failed, else rank 0
            proc = next((p for p in procs if p.returncode == -signal.SIGKILL),
                        next((p for p in procs if p.returncode != 0), procs[0]))
            if proc.returncode == -signal.SIGKILL and restarts < TRAINER_RESTARTS and not self.stop.is_set():
                restarts += 1
                self.progress.write(f"the trainer was killed (SIGKILL); starting it again ({restarts}/{TRAINER_RESTARTS}), "
                                    "it resumes from its last checkpoint")
                continue
            if proc.returncode != 0:
                log_path = rank_path(log_path, procs.index(proc))
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
                raise RunFailed(f"the trainer exited with code {proc.returncode} (log: {log_path}):\n{tail}")
            return

    async def _first_sync_timed(self, training: TrainingLoop) -> None:
        self.progress.status("waiting for the engine to serve (vLLM CPU start takes a minute or two)")
        started = time.monotonic()
        await training.sync_weights(0)
        self.timings["initial_weight_sync_seconds"] = time.monotonic() - started
        self.timings["fleet_ready_seconds"] = time.monotonic() - self.started

    def _connect(self, client_address: str) -> Any:
        """Ray Client, as a trainer pod connects (batches come over the executor's side channel).

        Not a driver on the head's node: a driver's core worker ends its whole process when
        the raylet goes away, and the Ray head stops while a batch request may still be
        blocked in a thread; a Ray Client connection just fails.
        """
        from rljob_client.rollout_stream import RolloutStream

        return RolloutStream(self.job, address=client_address).connect()

    def _on_step(self, record: StepRecord) -> None:
        self.records.append(record)
        self.trainer_metrics.step_done(record.step, record.rollout_seconds, record.train_seconds, record.sync_seconds,
                                       record.reward_mean)
        self.progress.step(record)
        self.children.snapshot()

    def _on_eval(self, point: EvalPoint) -> None:
        self.evals.append(point)
        if point.skipped:
            self.progress.write(f"eval after step {point.step}: skipped ({point.reason})")
        else:
            self.progress.write(f"eval after step {point.step}: mean reward {point.reward:.3f}, "
                                f"pass@1 {point.pass_at_1:.3f} ({point.samples} samples, {point.fleet} fleet)")

    def _exit_code(self) -> int:
        if self.failure:
            return EXIT_FAILED
        return EXIT_INTERRUPTED if self.interrupted else EXIT_OK

    async def _until_stopped(self, aw: Any) -> Any:
        """Await `aw` unless a stop (signal, watchdog) comes first; then cancel it and raise _Stopped."""
        task = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if self.failure:
            raise RunFailed(self.failure)
        raise _Stopped

    async def _watch(self) -> None:
        """Stop the run when every engine cell spent its restart budget, or the executor died."""
        while not await sleep_or_stop(self.stop, WATCH_SECONDS):
            if self.executor is not None and self.executor.proc is not None and not self.executor.alive():
                self.failure = (f"the executor exited with code {self.executor.proc.returncode} "
                                f"(log: {self.executor.log_path}):\n{self.executor.log_tail()}")
                self.stop.set()
                return
            statuses = self.controller.engine_statuses()
            if statuses and all(s.state == CellState.Failed for s in statuses):
                logs = ", ".join(str(self.logs / f"{s.name}-g{s.generation}.log") for s in statuses)
                self.failure = (f"every engine cell failed and spent its restart budget "
                                f"({statuses[0].message}); see {logs}")
                self.stop.set()

    async def _shutdown(self, executor: ExecutorProcess | None, stream: Any, api: LocalControlAPI,
                        ctrl_stop: asyncio.Event, ctrl_task: asyncio.Task[None]) -> None:
        self.children.snapshot()
        if stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.to_thread(stream.close), 20)
        ctrl_stop.set()  # first, so that no cell is recreated while the engines go
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ctrl_task, 30)
        status = self.controller.status_patch()
        restarts = int(status.get("restartsTotal") or 0)
        self.last_eval_status = status.get("lastEval")  # what status.lastEval holds, as on a cluster
        spawned = self.platform.spawned
        stopping = [self.platform.close()]
        if executor is not None:
            stopping.append(asyncio.to_thread(executor.stop))
        await asyncio.gather(*stopping, return_exceptions=True)  # each may take seconds: in parallel
        await api.close()
        with contextlib.suppress(Exception):
            await self.controller.close()
        left = await asyncio.to_thread(self.children.sweep)
        self.progress.close()
        self._write_report(restarts, spawned, left)

    def _write_report(self, restarts: int, spawned: int, left: list[dict[str, Any]]) -> None:
        self.timings["total_seconds"] = time.monotonic() - self.started
        summary = report.summarize(
            self.records,
            self.evals,
            status={"lastEval": self.last_eval_status},
            job=self.job,
            manifest=str(self.opts.manifest),
            requested_steps=self.prepared.steps,
            completed=len(self.records) == self.prepared.steps and not self.failure and not self.interrupted,
            interrupted=self.interrupted,
            failure=self.failure,
            engine_restarts=max(0, spawned - self.spec.inference.replicas),  # processes started beyond the first per cell
            engine_restarts_charged=restarts,  # those counted against spec.inference.restartPolicy.maxRestarts
            engine_processes_started=spawned,
            engine_cells=self.spec.inference.replicas,
            run_timings=self.timings,
            processes_left=left,
        )
        path = report.write_summary(self.out, summary)
        if self.records:
            report.plot_rewards(self.out, self.records, f"{self.job}: mean reward per step", self.evals)
        first, last = summary["first5_mean_reward"], summary["last5_mean_reward"]
        if first is not None:
            print(f"mean reward: first {min(5, len(self.records))} steps {first:.3f}, "
                  f"last {min(5, len(self.records))} steps {last:.3f}", file=sys.stderr)
        if self.failure:
            print(f"rljob run failed: {self.failure}", file=sys.stderr)
        if left:
            print(f"warning: {len(left)} child processes survived SIGKILL: {[r['pid'] for r in left]}", file=sys.stderr)
        print(f"summary: {path}" + (f"\nreward curve: {self.out / report.CURVE}" if self.records else ""),
              file=sys.stderr)


def trainer_env(spec: RLJobSpec, job: str, out: Path, steps: int, controller_url: str, token_file: str,
                rollout_address: str, metrics: Path, overlap: bool) -> dict[str, str]:
    """The environment of a trainer pod (operator manifests/trainer.py), as local mode has it.

    The reference trainer syncs by disk only; a trainer of your own gets the spec's method. The
    executor's Python and Ray are this interpreter's (the SDK checks them at connect).
    """
    import platform
    from importlib.metadata import version

    wu = spec.inference.weight_update
    env = dict(os.environ, RLJOB_CONTROLLER_URL=controller_url, RLJOB_NAME=job, RLJOB_NAMESPACE=LOCAL_NAMESPACE,
               RLJOB_CONTROLLER_TOKEN_FILE=token_file, RLJOB_ROLLOUT_ADDRESS=rollout_address,
               RANK="0", WORLD_SIZE="1", POD_NAME="trainer-0", RLJOB_WINDOW_HOLDER="trainer-0",
               RLJOB_MODEL_PATH=str(spec.model.path), RLJOB_WEIGHTS_DIR=str(out / "weights"),
               RLJOB_ENGINE=str(spec.inference.engine), RLJOB_PAUSE_MODE=str(wu.pause_mode),
               RLJOB_READY_TIMEOUT_SECONDS=f"{wu.ready_timeout_seconds:g}", RLJOB_STEPS=str(steps),
               RLJOB_METRICS_FILE=str(metrics), RLJOB_BUCKET_MEGABYTES=str(wu.bucket_megabytes),
               RLJOB_WEIGHT_UPDATE_METHOD=str(wu.method) if spec.trainer.command else "disk",
               RLJOB_OVERLAP="1" if overlap else "0",
               RLJOB_EXECUTOR_PYTHON=platform.python_version(), RLJOB_EXECUTOR_RAY=version("ray"))
    env.update({e.name: e.value for e in spec.trainer.env if e.value_from is None})  # valueFrom: from --env-file
    return env


def local_command(argv: list[str]) -> list[str]:
    """`python`/`python3` as the command runs this interpreter (the one that has rljob_client)."""
    return [sys.executable, *argv[1:]] if argv and argv[0] in ("python", "python3") else argv


def new_json_lines(path: Path, seen: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines `path` (a trainer's step or eval file) gained past its first `seen`, and its line count."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines[seen:]], len(lines)


def rank_path(path: Path, rank: int) -> Path:
    """Rank 0 keeps the one-rank name (trainer.log, trainer-steps.jsonl); rank r gets `-rank<r>`."""
    return path if rank == 0 else path.with_name(f"{path.stem}-rank{rank}{path.suffix}")


def rank_argv(argv: list[str], rank: int) -> list[str]:
    """A rank's own metrics and batches files: each rank appends its own lines."""
    out = list(argv)
    for flag in ("--metrics-file", "--batches-file"):
        if flag in out:
            i = out.index(flag) + 1
            out[i] = str(rank_path(Path(out[i]), rank))
    return out


class _Stopped(Exception):
    """Internal: a stop was requested while waiting."""


def run(opts: RunOptions) -> int:
    """Entry of `rljob run`; returns the exit code."""
    try:
        prepared = prepare(opts)
    except (ManifestError, LocalModeError) as exc:
        print(f"rljob run: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    opts.out.mkdir(parents=True, exist_ok=True)
    loop = asyncio.new_event_loop()
    try:
        # Not asyncio.run: it joins the default executor's threads at the end, and a thread
        # blocked in a Ray call on a cluster that is gone would hold the exit forever.
        return loop.run_until_complete(LocalRun(opts, prepared).run())
    finally:
        loop.close()
