"""Start and stop one vLLM CPU server as a local process (local mode's engine cell, tests' engine).

The command line and environment are pure functions (`vllm_command`, `vllm_env`) so they are
unit-tested; `VLLMProcess` is the I/O: a child in its own session (process group), its output
in a log file, `stop()` that signals the whole group (vLLM forks an EngineCore and a resource
tracker) and waits until every member is gone.

Memory: one server on the tiny model with `VLLM_CPU_KVCACHE_SPACE=1` is about 3.3 GiB.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller_runtime.engine_extensions import VLLM_LOGPROBS_ARGS, WEIGHT_TRANSFER_EXTENSION

BYTES_PER_CPU_ENGINE = int(3.3 * 2**30)
DEFAULT_KV_CACHE_GIB = 1


@dataclass(frozen=True)
class VLLMArgs:
    """What decides a vLLM server's command line."""

    model: str
    port: int
    host: str = "127.0.0.1"
    tokenizer: str | None = None
    dtype: str = "bfloat16"
    max_model_len: int = 512
    served_model_name: str | None = None
    seed: int | None = None
    extra_args: Sequence[str] = ()
    # Loaded always: inert until the trainer calls it (weightUpdate.method gloo/nccl).
    worker_extension: str | None = WEIGHT_TRANSFER_EXTENSION
    python: str = field(default_factory=lambda: sys.executable)


def vllm_command(args: VLLMArgs) -> list[str]:
    """The OpenAI-compatible server on the CPU build: eager mode (no graph capture on CPU)."""
    cmd = [
        args.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args.model,
        "--host", args.host,
        "--port", str(args.port),
        "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len),
        "--enforce-eager",
        "--disable-uvicorn-access-log",
        *VLLM_LOGPROBS_ARGS,
    ]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    if args.served_model_name:
        cmd += ["--served-model-name", args.served_model_name]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    if args.worker_extension:
        cmd += ["--worker-extension-cls", args.worker_extension]
    return cmd + list(args.extra_args)


def vllm_env(base: Mapping[str, str], extra: Mapping[str, str] | None = None,
             kv_cache_gib: int = DEFAULT_KV_CACHE_GIB) -> dict[str, str]:
    """Dev mode for the control routes (pause, collective_rpc, weight version); a small KV cache.

    Settings the caller already has win over the defaults here, and `extra` (the spec's
    engine env) wins over both.
    """
    env = dict(base)
    env.setdefault("VLLM_SERVER_DEV_MODE", "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")  # models are local paths; never ask a hub
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    return env


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the thread that started it dies (PR_SET_PDEATHSIG).

    The backstop for a runner killed with SIGKILL, which can stop nothing itself: without it
    a 3 GiB vLLM server would outlive `rljob run`. Children are started from long-lived
    threads (the event loop's, or its default executor's, which live until the loop closes).
    """
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists that is not a zombie.

    A zombie member that is our own child (e.g. an orphan re-parented to a subreaper parent) is
    reaped here; other zombies are dead already and only wait for their parent.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    me = os.getpid()
    for p in psutil.process_iter(["pid", "ppid", "status"]):
        try:
            if os.getpgid(p.info["pid"]) != pgid:
                continue
        except OSError:
            continue
        if p.info["status"] != psutil.STATUS_ZOMBIE:
            return True
        if p.info["ppid"] == me and p.info["pid"] != pgid:  # the leader is reaped by its Popen
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.info["pid"], os.WNOHANG)
    return False


def kill_group(pgid: int, timeout: float = 15.0, reap: Callable[[], object] | None = None) -> bool:
    """SIGTERM the group, SIGKILL what is left after `timeout`; True when the group is gone.

    `reap` (e.g. Popen.poll of the group leader, when it is our child) is called while
    waiting: an unreaped zombie leader would keep the group "alive" forever.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if reap is not None:
                reap()
            if not group_alive(pgid):
                return True
            time.sleep(0.05)
    return not group_alive(pgid)


class VLLMProcess:
    """One vLLM server process group. Not started until `start()`."""

    def __init__(self, args: VLLMArgs, log_path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> None:
        self.args = args
        self.log_path = Path(log_path)
        self.env = vllm_env(os.environ if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.args.host}:{self.args.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Own session: one killpg reaches the API server, its EngineCore and helpers,
            # and a Ctrl-C in the terminal reaches only the runner, which stops us in order.
            self.proc = subprocess.Popen(
                vllm_command(self.args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True, preexec_fn=die_with_parent,
            )

    def returncode(self) -> int | None:
        """None while running; the exit status once the server process has exited."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the whole group; True when nothing of it is left."""
        if self.proc is None:
            return True
        gone = kill_group(self.proc.pid, timeout, reap=self.proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1.0)
        return gone

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

