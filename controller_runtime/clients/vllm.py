"""vLLM 0.32 client: the OpenAI completions route plus the dev-mode control routes.

Routes and shapes were read from vllm/entrypoints in the installed 0.32 (serve/dev/*,
rl/online/api_router.py); the control routes exist only with VLLM_SERVER_DEV_MODE=1.
On the CPU build `sleep`/`wake_up` only pause the scheduler: memory is not released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from controller_runtime.api.spec import MemoryTag, PauseMode
from controller_runtime.clients.completions import Completion, completion_request, parse_completion
from controller_runtime.clients.http import DEFAULT_TIMEOUT_S, EngineHTTP, expect_field, expect_object
from controller_runtime.clients.prometheus import parse_prometheus
from controller_runtime.engine_extensions import WEIGHT_TRANSFER_EXTENSION
from controller_runtime.errors import EngineError, EngineProtocolError

__all__ = ["WEIGHT_TRANSFER_EXTENSION", "VLLMClient"]

# Tags vLLM's wake_up understands; CUDA graphs are rebuilt with the KV cache.
_VLLM_WAKE_TAGS = {
    MemoryTag.weights: "weights",
    MemoryTag.kv_cache: "kv_cache",
    MemoryTag.cuda_graph: "kv_cache",
}


class VLLMClient:
    """One vLLM server. Implements controller_runtime.ports.EngineClient."""

    def __init__(
        self, endpoint: str, timeout: float = DEFAULT_TIMEOUT_S, session: aiohttp.ClientSession | None = None
    ) -> None:
        self._http = EngineHTTP(endpoint, timeout, session)
        self.endpoint = self._http.endpoint

    # -- data plane ---------------------------------------------------------------------

    async def completions(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 1.0,
        n: int = 1,
        logprobs: bool = True,
        seed: int | None = None,
        model: str | None = None,
        stop_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        extra: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Completion:
        """POST /v1/completions with `return_token_ids`; each choice carries token ids (+logprobs)."""
        body = completion_request(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            n=n,
            logprobs=logprobs,
            seed=seed,
            model=model,
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
            extra=extra,
        )
        reply = await self._http.post_json("/v1/completions", body, timeout_s=timeout_s)
        return parse_completion(self.endpoint, reply, want_logprobs=logprobs)

    # -- health and metrics -------------------------------------------------------------

    async def health(self) -> None:
        """GET /health: 200 when the engine core is alive (503 once it died)."""
        await self._http.probe("/health")

    async def metrics(self) -> dict[str, float]:
        """GET /metrics, the `vllm:` samples summed over labels (e.g. vllm:num_requests_running)."""
        reply = await self._http.request("GET", "/metrics")
        parsed = parse_prometheus(reply.text, prefix="vllm:")
        if not parsed:
            raise EngineProtocolError(self.endpoint, "/metrics: no vllm: samples")
        return parsed

    # -- pause / sleep --------------------------------------------------------------------

    async def pause(self, mode: PauseMode = PauseMode.wait) -> None:
        """POST /pause?mode=abort|wait|keep: new and (per mode) running requests wait for resume."""
        await self._http.post_json("/pause", params={"mode": PauseMode(mode).value})

    async def resume(self) -> None:
        await self._http.post_json("/resume")

    async def is_paused(self) -> bool:
        return expect_field(
            self.endpoint, "/is_paused", await self._http.get_json("/is_paused"), "is_paused", bool
        )

    async def sleep(self, level: int = 1, mode: PauseMode = PauseMode.abort) -> None:
        """POST /sleep?level=&mode=: level 1 offloads weights and drops KV, level 2 drops both."""
        await self._http.post_json("/sleep", params={"level": str(level), "mode": PauseMode(mode).value})

    async def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """POST /wake_up?tags=...; returns True when the engine is fully awake afterwards."""
        params = [("tags", t) for t in tags] if tags else None
        body = await self._http.post_json("/wake_up", params=params)
        return expect_field(self.endpoint, "/wake_up", body, "status", str) == "awake"

    async def is_sleeping(self) -> bool:
        body = await self._http.get_json("/is_sleeping")
        return expect_field(self.endpoint, "/is_sleeping", body, "is_sleeping", bool)

    async def release_kv_cache_memory(self) -> None:
        await self._http.post_json("/release_kv_cache_memory")

    async def release_memory(self, tags: Sequence[MemoryTag]) -> None:
        """Offload: weights among the tags → sleep level 1; only KV/graphs → drop the KV cache."""
        if MemoryTag.weights in {MemoryTag(t) for t in tags}:
            await self.sleep(level=1)
        else:
            await self.release_kv_cache_memory()

    async def resume_memory(self, tags: Sequence[MemoryTag]) -> None:
        """Wake the tags one at a time: vLLM ignores a whole wake_up call when any one of its
        tags is already awake, so waking [weights, kv_cache] after weights alone does nothing."""
        wake = sorted({_VLLM_WAKE_TAGS[MemoryTag(t)] for t in tags}, key=("weights", "kv_cache").index)
        if not wake:
            await self.wake_up(None)
        for tag in wake:
            await self.wake_up([tag])

    # -- caches and requests ----------------------------------------------------------------

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """POST /reset_prefix_cache; False when blocks are still held by running requests."""
        params = {"reset_running_requests": "true"} if reset_running_requests else None
        body = await self._http.post_json("/reset_prefix_cache", params=params)
        return expect_field(self.endpoint, "/reset_prefix_cache", body, "success", bool)

    async def flush_cache(self) -> None:
        """Reset the prefix cache; raise (so the caller retries) while requests still hold blocks."""
        if not await self.reset_prefix_cache():
            raise EngineError(self.endpoint, "prefix cache not reset: running requests still hold blocks")

    async def abort_requests(self, request_ids: Sequence[str] = ()) -> int:
        """POST /abort_requests: the named requests, or every in-flight one; returns how many."""
        body = await self._http.post_json(
            "/abort_requests", {"request_ids": list(request_ids)} if request_ids else {}
        )
        return expect_field(self.endpoint, "/abort_requests", body, "aborted", int)

    async def abort_all(self) -> None:
        await self.abort_requests()

    # -- weights ------------------------------------------------------------------------------

    async def collective_rpc(
        self,
        method: str,
        args: Sequence[str] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        rpc_timeout: float | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """POST /collective_rpc: call `method` on every worker; one result per worker."""
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": kwargs or {}}
        if rpc_timeout is not None:
            body["timeout"] = rpc_timeout
        reply = await self._http.request("POST", "/collective_rpc", json_body=body, timeout_s=timeout_s)
        if not reply.text:  # the route answers an empty 200 when the call returned None
            return []
        return expect_field(self.endpoint, "/collective_rpc", reply.json(self.endpoint), "results", list)

    async def reload_weights(self, path: str, *, timeout_s: float | None = None) -> None:
        """Swap in the safetensors under `path` (same architecture) via the workers' reload_weights."""
        await self.collective_rpc("reload_weights", kwargs={"weights_path": path}, timeout_s=timeout_s)

    # -- process-group weight transfer (rljob_client.engine.vllm_worker_extension) ------------------

    async def init_weight_transfer(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        backend: str = "gloo",
        group_name: str = "rljob-weights",
        transfer_timeout_s: float = 60.0,
    ) -> list[Any]:
        """Every worker joins the trainer's group (ranks rank_offset + worker rank); needs the
        engine started with `--worker-extension-cls` (WEIGHT_TRANSFER_EXTENSION)."""
        kwargs = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                  "world_size": world_size, "backend": backend, "group_name": group_name,
                  "timeout_s": transfer_timeout_s}
        return await self.collective_rpc("init_weight_transfer", kwargs=kwargs,
                                         timeout_s=transfer_timeout_s + self._http.timeout)

    async def receive_weights(self, plan_json: str, *, transfer_timeout_s: float = 60.0, digest: bool = False,
                              timeout_s: float | None = None) -> list[Any]:
        """Workers receive the buckets of `plan_json` while the trainer broadcasts them; answers
        when every bucket is loaded (one summary per worker). `digest`: keep per-tensor sha256s."""
        kwargs = {"plan": plan_json, "timeout_s": transfer_timeout_s, "digest": digest}
        return await self.collective_rpc("receive_weights", kwargs=kwargs, timeout_s=timeout_s)

    async def received_checksums(self) -> dict[str, str]:
        """tensor -> sha256 of what the last process-group update loaded, merged over workers
        (every worker receives whole tensors; two that disagree make the tensor unreadable)."""
        merged: dict[str, str] = {}
        for worker in await self.collective_rpc("received_weight_checksums"):
            if not isinstance(worker, dict):
                raise EngineProtocolError(self.endpoint, f"received_weight_checksums: {type(worker).__name__}")
            for name, digest in worker.items():
                merged[str(name)] = str(digest) if merged.get(str(name), str(digest)) == str(digest) else "<workers disagree>"
        return merged

    async def close_weight_transfer(self) -> None:
        await self.collective_rpc("close_weight_transfer")

    # -- vLLM's own weight-transfer engine (--weight-transfer-config; rljob_client.weights.native_nccl) --

    async def init_weight_transfer_engine(self, init_info: dict[str, Any], *, timeout_s: float | None = None) -> None:
        """Every worker joins the trainer's group; answers once the rendezvous completed."""
        await self._http.post_json("/init_weight_transfer_engine", {"init_info": init_info}, timeout_s=timeout_s)

    async def start_weight_update(self) -> None:
        await self._http.post_json("/start_weight_update")

    async def update_weights(self, update_info: dict[str, Any], *, timeout_s: float | None = None) -> None:
        """Workers receive the named tensors (one broadcast each, in order) and load them."""
        await self._http.post_json("/update_weights", {"update_info": update_info}, timeout_s=timeout_s)

    async def finish_weight_update(self, version: str | None = None) -> None:
        await self._http.post_json("/finish_weight_update", {"weight_version": version})

    async def shutdown_weight_transfer_engine(self) -> None:
        await self._http.post_json("/shutdown_weight_transfer_engine")

    async def weight_info(self) -> dict[str, Any]:
        return expect_object(self.endpoint, "/weight_info", await self._http.get_json("/weight_info"))

    async def get_weight_version(self) -> str | None:
        body = await self.weight_info()
        version = body.get("weight_version")
        if version is not None and not isinstance(version, str):
            raise EngineProtocolError(
                self.endpoint, f"/weight_info: weight_version is {type(version).__name__}"
            )
        return version

    async def update_weight_version(self, version: str) -> None:
        body = await self._http.post_json("/update_weight_version", {"new_version": version})
        if expect_field(self.endpoint, "/update_weight_version", body, "success", bool) is not True:
            raise EngineError(self.endpoint, f"weight version not set: {body}")

    async def set_weight_version(self, version: str) -> None:
        await self.update_weight_version(version)

    async def update_weights_from_disk(self, path: str, version: str | None = None) -> None:
        await self.reload_weights(path)
        if version is not None:
            await self.update_weight_version(version)

    async def weight_checker(self, action: str, baseline: dict[str, str] | None = None) -> dict[str, Any]:
        """POST /weight_checker {action: checksum|reset|compare, baseline?}."""
        body: dict[str, Any] = {"action": action}
        if baseline is not None:
            body["baseline"] = baseline
        return expect_object(
            self.endpoint, "/weight_checker", await self._http.post_json("/weight_checker", body)
        )

    async def weight_checksums(self) -> dict[str, str]:
        body = await self.weight_checker("checksum")
        sums = expect_field(self.endpoint, "/weight_checker", body, "checksums", dict)
        return {str(k): str(v) for k, v in sums.items()}

    async def close(self) -> None:
        await self._http.close()
