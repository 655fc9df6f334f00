"""vLLM worker extension: receive weights from the trainer over a process group of its own.

Loaded with `--worker-extension-cls rljob_client.engine.vllm_worker_extension.WeightTransferExtension`
(vLLM mixes the class into its worker) and driven through `/collective_rpc`, which runs a
method on every worker of the engine and answers when all returned:

- `init_weight_transfer(master_address, master_port, rank_offset, world_size, backend,
  group_name, timeout_s)`: join the trainer's group. The group is built directly on a
  TCPStore, never through `init_process_group`, so it is not vLLM's own world (the engine's
  TP/PP groups stay as they are). The trainer is rank 0; this worker is `rank_offset` plus its
  rank inside the engine.
- `receive_weights(plan, timeout_s)`: for each bucket of the plan (names, dtypes, shapes and
  offsets, sent in the call itself), receive the trainer's broadcast of one flat buffer and
  hand its tensors to the model's `load_weights` (which shards them for this worker's TP rank).
- `received_weight_checksums()`: sha256 per tensor of what the last receive loaded (asked for
  with `digest`), for the controller's check against the trainer's expected checksums.
- `close_weight_transfer()`: leave the group; the next window forms a new one.
- `set_weight_transfer_cpus(spread)`: run the transfer's threads off the cores vLLM pins its
  compute to (off by default; the bench measures both).

`receive_weights` answers with where its time went (inside the broadcasts, waiting for a
bucket, hashing, loading), which the bench reports per part.

Nothing here runs until called, so the extension is loaded into every engine (it is inert for
the disk method). The same code serves `gloo` on CPU and `nccl` on GPUs (buffers on the
worker's device). The collectives' timeout bounds every call: a peer that dies or a group that
never forms makes the call fail after `timeout_s` instead of hanging the engine; a failed
receive leaves the model half-updated, so it also leaves the group and the caller aborts the
window (the controller then recreates the engine).

Imports: torch, the standard library and `rljob_client.weights.buckets`/`.group` only (this module
runs inside the vLLM worker process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed import PrefixStore

from rljob_client.weights.buckets import Bucket, tensor_digest, unpack_bucket
from rljob_client.weights.group import broadcast_from, connect_store, new_process_group

log = logging.getLogger(__name__)


def allow_amx() -> bool:
    """Ask Linux for the AMX tile state for this process (and the ones it forks), once, where
    the CPU has AMX; answers whether AMX may be used now.

    vLLM's CPU attention runs AMX tile instructions (bf16, head size a multiple of 32) without
    asking for that state first; until a process asks (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, as
    torch's `_init_amx` does), the first one is SIGILL. On a Sapphire Rapids machine every
    engine of the test model died at its first request (`Worker proc VllmWorker-0 died
    unexpectedly (exit code: -4)`), unless something else in the worker (oneDNN, for larger
    matrices) had asked already. vLLM loads this module in each worker before the model runs,
    which is the moment to ask."""
    cpu = getattr(torch, "cpu", None)
    if cpu is None or not getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return False
    init = getattr(cpu, "_init_amx", None)
    return bool(init()) if init is not None else False


allow_amx()


def transfer_cpus() -> set[int]:
    """CPUs for the transfer's threads: those the engine process may use minus the ones vLLM's
    CPU worker pinned its compute to (all of them if that leaves none).

    vLLM's CPU worker binds its thread, and so every thread it starts, to its OpenMP cores; the
    receive thread and gloo's own threads then share one core with the load they overlap.
    Whether moving them pays depends on who else uses the other cores. On GPU workers nothing is
    pinned and this changes nothing.
    """
    try:
        pinned = os.sched_getaffinity(0)
        allowed = os.sched_getaffinity(os.getppid()) | pinned
    except OSError:
        return set()
    return (allowed - pinned) or allowed


@contextlib.contextmanager
def on_cpus(cpus: set[int]) -> Iterator[None]:
    """Run the block (and every thread it starts) on `cpus`, then restore the calling thread's."""
    before = os.sched_getaffinity(0)
    try:
        if cpus and cpus != before:
            os.sched_setaffinity(0, cpus)
    except OSError as exc:  # a cgroup may forbid it: the transfer still works, only slower
        log.info("weight transfer: staying on CPUs %s: %s", sorted(before), exc)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


class ReceiveAhead:
    """Receives bucket i+1 in a thread while the caller loads bucket i (at most one bucket
    waits), so the link and the loader overlap; a receive error surfaces in the caller.

    With `digests`, the thread also hashes every tensor it received before handing the bucket
    over, so verification stays off the loader's path (and hashes the bytes as they arrived).
    """

    def __init__(self, group: Any, buckets: list[Bucket], device: torch.device, timeout_s: float,
                 digests: dict[str, str] | None = None, cpus: set[int] | None = None) -> None:
        self.buckets = buckets
        self.timeout_s = timeout_s
        self.digests = digests
        self.digest_s = 0.0
        self.ready: queue.Queue[tuple[Bucket, torch.Tensor] | BaseException] = queue.Queue(maxsize=1)
        self.stopped = threading.Event()
        self.receive_s = 0.0  # time the thread spent inside the broadcasts (the link)
        self.thread = threading.Thread(target=self._run, args=(group, device), name="rljob-receive", daemon=True)
        with on_cpus(cpus or set()):
            self.thread.start()

    def _put(self, item: tuple[Bucket, torch.Tensor] | BaseException) -> None:
        while not self.stopped.is_set():
            try:
                self.ready.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _run(self, group: Any, device: torch.device) -> None:
        try:
            for bucket in self.buckets:
                if self.stopped.is_set():
                    return
                buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
                started = time.perf_counter()
                broadcast_from(group, buf, 0, self.timeout_s)
                self.receive_s += time.perf_counter() - started
                if self.digests is not None:
                    hashed = time.perf_counter()
                    self.digests.update((name, tensor_digest(t)) for name, t in unpack_bucket(bucket, buf))
                    self.digest_s += time.perf_counter() - hashed
                self._put((bucket, buf))
        except BaseException as exc:
            self._put(exc)

    def __iter__(self) -> Iterator[tuple[Bucket, torch.Tensor]]:
        for _ in self.buckets:
            try:
                item = self.ready.get(timeout=self.timeout_s + 5.0)
            except queue.Empty:
                raise TimeoutError(f"no bucket within {self.timeout_s:g} s") from None
            if isinstance(item, BaseException):
                raise item
            yield item

    def stop(self) -> None:
        """After the group was closed on failure, the thread's receive ends; never wait long."""
        self.stopped.set()
        self.thread.join(self.timeout_s + 5.0)


PROFILE_DIR_ENV = "RLJOB_WEIGHT_PROFILE_DIR"


def _profiler() -> Any:
    """A cProfile of the receive's loading thread when RLJOB_WEIGHT_PROFILE_DIR is set (the
    bench's `--profile`): the breakdown of vLLM's reload by function, off by default."""
    if not os.environ.get(PROFILE_DIR_ENV):
        return None
    import cProfile

    return cProfile.Profile()


def _dump_profile(profiler: Any) -> None:
    out = Path(os.environ[PROFILE_DIR_ENV])
    out.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(out / f"receive-{os.getpid()}-{time.time_ns()}.pstats")


class WeightTransferExtension:
    """Mixed into vLLM's worker; `self` is the worker (model_runner, device, rank)."""

    _rljob_group: Any = None
    _rljob_store: Any = None
    _rljob_backend: str = "gloo"
    _rljob_timeout_s: float = 60.0
    _rljob_received: dict[str, str] = {}
    # transfer threads off vLLM's compute cores (transfer_cpus): off by default, because where the
    # other cores are busy (the trainer's, on a small machine) spreading is slower; where an
    # engine has cores to spare, `set_weight_transfer_cpus(True)`
    _rljob_spread: bool = False

    def _rljob_transfer_cpus(self) -> set[int]:
        return transfer_cpus() if self._rljob_spread else set()

    def set_weight_transfer_cpus(self, spread: bool | str = True) -> bool:
        """Whether the next windows' transfer threads leave vLLM's compute cores (`False`, the
        default: they stay where vLLM's worker runs); the bench measures both in one run."""
        self._rljob_spread = spread is True or str(spread).lower() == "true"
        return self._rljob_spread

    def _rljob_worker_rank(self) -> int:
        rank = getattr(self, "rank", 0)
        return int(rank) if isinstance(rank, int) else 0

    def _rljob_device(self) -> torch.device:
        if self._rljob_backend == "nccl":
            device = getattr(self, "device", None)
            return device if isinstance(device, torch.device) else torch.device("cuda")
        return torch.device("cpu")

    def init_weight_transfer(
        self,
        master_address: str,
        master_port: int | str,
        rank_offset: int | str,
        world_size: int | str,
        backend: str = "gloo",
        group_name: str = "rljob-weights",
        timeout_s: float | str = 60.0,
    ) -> dict[str, Any]:
        self.close_weight_transfer()
        rank = int(rank_offset) + self._rljob_worker_rank()
        timeout = float(timeout_s)
        started = time.monotonic()
        store = connect_store(master_address, int(master_port), int(world_size), False, timeout)
        self._rljob_backend = backend
        self._rljob_timeout_s = timeout
        self._rljob_store = store
        with on_cpus(self._rljob_transfer_cpus()):  # gloo's threads start here and keep this affinity
            self._rljob_group = new_process_group(backend, PrefixStore(group_name, store), rank, int(world_size),
                                                  timeout)
        # the trainer's handshake: returns once every rank is connected (or fails at the timeout)
        broadcast_from(self._rljob_group, torch.zeros(1, dtype=torch.uint8, device=self._rljob_device()), 0, timeout)
        log.info("weight transfer: joined %s as rank %d of %d (%s) in %.2f s", group_name, rank, world_size,
                 backend, time.monotonic() - started)
        return {"rank": rank, "world_size": int(world_size), "backend": backend}

    def receive_weights(self, plan: str | list[dict[str, Any]], timeout_s: float | str | None = None,
                        digest: bool | str = False) -> dict[str, Any]:
        """Receive every bucket of `plan` (JSON: a list of buckets) and load it.

        With `digest`, the sha256 of every tensor as received is kept for
        `received_weight_checksums` (the trainer's expected checksums are over the same bytes;
        the engine's own parameters are in kernel layout and cannot be compared with them).
        """
        group = self._rljob_group
        if group is None:
            raise RuntimeError("receive_weights before init_weight_transfer")
        buckets = [Bucket.from_wire(b) for b in (json.loads(plan) if isinstance(plan, str) else plan)]
        timeout = float(timeout_s) if timeout_s is not None else self._rljob_timeout_s
        device = self._rljob_device()
        started = time.monotonic()
        counts = {"tensors": 0, "bytes": 0}
        want_digest = digest is True or str(digest).lower() == "true"
        digests: dict[str, str] = {}
        self._rljob_received = {}

        ahead = ReceiveAhead(group, buckets, device, timeout, digests if want_digest else None,
                             self._rljob_transfer_cpus())
        # where the update's time goes: waiting for the link, and the rest of the reload (vLLM's
        # load_weights and re-processing)
        spent = {"wait": 0.0}

        def received() -> Iterator[tuple[str, torch.Tensor]]:
            arrivals = iter(ahead)
            while True:
                waited = time.perf_counter()
                item = next(arrivals, None)
                spent["wait"] += time.perf_counter() - waited
                if item is None:
                    return
                bucket, buf = item
                counts["bytes"] += bucket.nbytes
                for name, tensor in unpack_bucket(bucket, buf):
                    counts["tensors"] += 1
                    yield name, tensor

        profiler = _profiler()
        try:
            # vLLM's in-place reload (what reload_weights from disk runs) over a stream of
            # buckets: it restores the loaders that post-processing removed, loads, re-processes.
            if profiler is not None:
                profiler.enable()
            self.model_runner.reload_weights(weights_iterator=received(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        except BaseException:
            # The model may hold part of the new weights: leave the group so that nothing
            # waits on it, and let the caller abort the window (the engine is recreated).
            self.close_weight_transfer()
            self._rljob_finish_interrupted_reload()
            raise
        finally:
            if profiler is not None:
                profiler.disable()
                _dump_profile(profiler)
            ahead.stop()
        tensors, nbytes = counts["tensors"], counts["bytes"]
        self._rljob_received = digests
        seconds = time.monotonic() - started
        return {"tensors": tensors, "bytes": nbytes, "seconds": round(seconds, 4),
                "receive_seconds": round(ahead.receive_s, 4), "wait_seconds": round(spent["wait"], 4),
                "digest_seconds": round(ahead.digest_s, 4), "load_seconds": round(seconds - spent["wait"], 4)}

    def _rljob_finish_interrupted_reload(self) -> None:
        """Close the layerwise reload an interrupted stream left open (its loaders stay wrapped
        otherwise, and every later reload fails): layers that got their tensors are processed,
        the others get their old kernel tensors back. The weights are then a mix of two
        versions, so the engine stays paused until the next complete update or its recreation."""
        try:
            from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

            finalize_layerwise_reload(self.model_runner.get_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        except Exception as exc:
            log.warning("weight transfer: could not close the interrupted reload: %s", exc)

    def received_weight_checksums(self) -> dict[str, str]:
        """tensor -> sha256 of the bytes the last completed `receive_weights(digest=True)` loaded."""
        return dict(self._rljob_received)

    def close_weight_transfer(self) -> bool:
        had = self._rljob_group is not None
        group, self._rljob_group, self._rljob_store = self._rljob_group, None, None
        if group is not None:
            shutdown = getattr(group, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception as exc:  # a broken group may refuse to shut down cleanly
                    log.warning("weight transfer: group shutdown failed: %s", exc)
        return had
