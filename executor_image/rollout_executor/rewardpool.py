"""Worker processes for synchronous rewards, so that scoring never holds the event loop.

Each worker is a `python -m rollout_executor.reward_worker` child talking frames over its
pipes (a subprocess, not multiprocessing: inside a Ray actor `__main__` is Ray's, which
spawn would re-import). A call takes an idle worker, sends the sample and awaits the reply
with a timeout; a worker that times out is killed, and one that died (or was killed) is
replaced by a fresh one, so one bad sample costs one call, never the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
import sys
from dataclasses import dataclass
from typing import Any

from rljob_client.errors import RLJobError

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
START_TIMEOUT_S = 60.0


class RewardCallError(RLJobError):
    """One call failed: the reward raised, timed out, or its worker died. `reason` says which."""

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


class RewardPoolStartError(RLJobError):
    """A worker could not import the reward function; the message carries the import error."""


@dataclass(eq=False)
class _Worker:
    proc: asyncio.subprocess.Process

    async def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(_LEN.pack(len(data)) + data)
        await self.proc.stdin.drain()

    async def recv(self) -> Any:
        assert self.proc.stdout is not None
        head = await self.proc.stdout.readexactly(_LEN.size)
        (n,) = _LEN.unpack(head)
        return pickle.loads(await self.proc.stdout.readexactly(n))

    async def kill(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()
        if self.proc.stdout is not None:  # read to EOF: the pipe's transport closes now, not when collected
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.stdout.read(), 5.0)


def _child_env() -> dict[str, str]:
    """The parent's import path, so the worker imports the same reward module (ConfigMap code too)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class RewardPool:
    def __init__(self, function: str, workers: int, timeout_seconds: float) -> None:
        self.function = function
        self.size = workers
        self.timeout_seconds = timeout_seconds
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self.replaced = 0
        self._closed = False
        self._replacing: set[asyncio.Task[None]] = set()

    async def _spawn(self) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rollout_executor.reward_worker", self.function,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=_child_env(),
        )
        w = _Worker(proc)
        self._all.add(w)
        try:
            kind, detail = await asyncio.wait_for(w.recv(), timeout=START_TIMEOUT_S)
        except (asyncio.IncompleteReadError, TimeoutError) as e:
            await self._drop(w)
            raise RewardPoolStartError(f"reward worker for {self.function} did not start ({type(e).__name__}, exit code {proc.returncode})") from e
        if kind != "ready":
            await self._drop(w)
            raise RewardPoolStartError(f"reward worker cannot load {self.function}: {detail}")
        return w

    async def _drop(self, w: _Worker) -> None:
        self._all.discard(w)
        await w.kill()

    async def start(self) -> None:
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)), return_exceptions=True)
        errors = [w for w in workers if isinstance(w, BaseException)]
        for w in workers:
            if isinstance(w, _Worker):
                self._idle.put_nowait(w)
        if errors:
            await self.close()
            raise errors[0]

    async def _replace(self, w: _Worker) -> None:
        await self._drop(w)
        while not self._closed:
            try:
                self._idle.put_nowait(await self._spawn())
                return
            except RewardPoolStartError as e:  # the module imported at start: a passing fault
                log.warning("replacing a reward worker failed, trying again: %s", e)
                await asyncio.sleep(1.0)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._all]

    async def call(self, sample: Any, kwargs: dict[str, Any]) -> Any:
        """The reward of one sample, computed in a worker; RewardCallError if it fails."""
        w = await self._idle.get()
        healthy = False
        try:
            await w.send((sample, kwargs))
            kind, value = await asyncio.wait_for(w.recv(), timeout=self.timeout_seconds)
            healthy = True
        except TimeoutError:
            raise RewardCallError(f"timed out after {self.timeout_seconds:g}s (its worker was killed)", "timeout") from None
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as e:
            code = w.proc.returncode
            raise RewardCallError(f"its worker process died (exit code {code}): {type(e).__name__}", "worker_died") from e
        finally:
            if healthy:
                self._idle.put_nowait(w)
            else:  # timed out, died, or the caller was cancelled mid-call: the worker's state is unknown
                self.replaced += 1  # counted when decided, so a call's caller already sees it
                t = asyncio.ensure_future(self._replace(w))
                self._replacing.add(t)
                t.add_done_callback(self._replacing.discard)
        if kind != "ok":
            raise RewardCallError(f"raised {value}", "error")
        return value

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._replacing)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in list(self._all):
            await self._drop(w)
