"""SGLang client: the native control routes of sglang/srt/entrypoints/http_server.py.

Shapes follow SGLang's io_struct request dataclasses (read from the public repository):
release/resume_memory_occupation {tags}, update_weights_from_disk {model_path, weight_version},
pause_generation {mode: abort|retract|in_place}, abort_request {rid, abort_all},
update_weight_version {new_version, abort_all_requests}, weights_checker {action}.
Routes that fail answer HTTP 400 with {"success": false, "message": ...}, which surfaces as
EngineHTTPError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from controller_runtime.api.spec import MemoryTag, PauseMode
from controller_runtime.clients.http import DEFAULT_TIMEOUT_S, EngineHTTP, expect_field, expect_object
from controller_runtime.errors import EngineError, EngineProtocolError

# SGLang has no "wait": `retract` is the mode that, like vLLM's wait, loses no request (the
# running ones go back to the queue and are recomputed after continue_generation).
SGLANG_PAUSE_MODE = {PauseMode.abort: "abort", PauseMode.wait: "retract", PauseMode.keep: "in_place"}


class SGLangClient:
    """One SGLang server. Implements controller_runtime.ports.EngineClient."""

    def __init__(
        self, endpoint: str, timeout: float = DEFAULT_TIMEOUT_S, session: aiohttp.ClientSession | None = None
    ) -> None:
        self._http = EngineHTTP(endpoint, timeout, session)
        self.endpoint = self._http.endpoint

    async def _post_success(
        self, route: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> dict[str, Any]:
        """POST a route that answers {"success": bool, "message": str}; raise unless success."""
        reply = expect_object(
            self.endpoint, route, await self._http.post_json(route, body, timeout_s=timeout_s)
        )
        if expect_field(self.endpoint, route, reply, "success", bool) is not True:
            raise EngineError(self.endpoint, f"{route}: {reply.get('message', '')}")
        return reply

    # -- health ---------------------------------------------------------------------------

    async def health_generate(self) -> None:
        """GET /health_generate: 200 once the engine generated one token (503 otherwise)."""
        await self._http.probe("/health_generate")

    async def health(self) -> None:
        await self.health_generate()

    # -- generation control ---------------------------------------------------------------

    async def pause_generation(self, mode: str = "abort") -> None:
        await self._http.request("POST", "/pause_generation", json_body={"mode": mode})

    async def continue_generation(self) -> None:
        await self._http.request("POST", "/continue_generation", json_body={})

    async def pause(self, mode: PauseMode = PauseMode.wait) -> None:
        await self.pause_generation(SGLANG_PAUSE_MODE[PauseMode(mode)])

    async def resume(self) -> None:
        await self.continue_generation()

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        await self._http.request("POST", "/abort_request", json_body={"rid": rid, "abort_all": abort_all})

    async def abort_all(self) -> None:
        await self.abort_request(abort_all=True)

    async def flush_cache(self) -> None:
        """POST /flush_cache; HTTP 400 (EngineHTTPError) while requests are running, so retry."""
        await self._http.request("POST", "/flush_cache")

    # -- memory ---------------------------------------------------------------------------

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        body = {"tags": list(tags) if tags is not None else None}
        await self._http.request("POST", "/release_memory_occupation", json_body=body)

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        body = {"tags": list(tags) if tags is not None else None}
        await self._http.request("POST", "/resume_memory_occupation", json_body=body)

    async def release_memory(self, tags: Sequence[MemoryTag]) -> None:
        await self.release_memory_occupation([MemoryTag(t).value for t in tags])

    async def resume_memory(self, tags: Sequence[MemoryTag]) -> None:
        await self.resume_memory_occupation([MemoryTag(t).value for t in tags])

    # -- weights --------------------------------------------------------------------------

    async def update_weights_from_disk(
        self,
        path: str,
        version: str | None = None,
        *,
        load_format: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        body: dict[str, Any] = {"model_path": path}
        if version is not None:
            body["weight_version"] = version
        if load_format is not None:
            body["load_format"] = load_format
        await self._post_success("/update_weights_from_disk", body, timeout_s=timeout_s)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        *,
        timeout_s: float | None = None,
    ) -> None:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        await self._post_success("/init_weights_update_group", body, timeout_s=timeout_s)

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str = "weight_update_group",
        *,
        flush_cache: bool = True,
        weight_version: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        await self._post_success("/update_weights_from_distributed", body, timeout_s=timeout_s)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        load_format: str | None = None,
        flush_cache: bool = True,
        weight_version: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "serialized_named_tensors": list(serialized_named_tensors),
            "load_format": load_format,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        await self._post_success("/update_weights_from_tensor", body, timeout_s=timeout_s)

    async def get_weight_version(self) -> str | None:
        body = expect_object(
            self.endpoint, "/get_weight_version", await self._http.get_json("/get_weight_version")
        )
        version = body.get("weight_version")
        if version is not None and not isinstance(version, str):
            raise EngineProtocolError(
                self.endpoint, f"/get_weight_version: weight_version is {type(version).__name__}"
            )
        return version

    async def set_weight_version(self, version: str) -> None:
        await self._post_success(
            "/update_weight_version", {"new_version": version, "abort_all_requests": False}
        )

    async def weights_checker(self, action: str) -> dict[str, Any]:
        """POST /weights_checker {action}: checksum (current SGLang), snapshot|reset_tensors|compare (older)."""
        return await self._post_success("/weights_checker", {"action": action})

    async def weight_checksums(self) -> dict[str, str]:
        """The `checksum` action's per-rank tables merged as `rank{r}/{tensor}` (as miles does:
        tensor-parallel ranks hold shards under the same names)."""
        reply = await self.weights_checker("checksum")
        ranks = reply.get("ranks")
        if not isinstance(ranks, list) or not ranks:
            raise EngineProtocolError(self.endpoint, f"/weights_checker: no ranks in {str(reply)[:200]}")
        merged: dict[str, str] = {}
        for position, entry in enumerate(ranks):
            sums = entry.get("checksums") if isinstance(entry, dict) else None
            if not isinstance(sums, dict):
                raise EngineProtocolError(self.endpoint, "/weights_checker: a rank has no checksums table")
            info = entry.get("parallelism_info")
            rank = info.get("rank", position) if isinstance(info, dict) else position
            merged.update({f"rank{rank}/{name}": str(value) for name, value in sums.items()})
        return merged

    async def close(self) -> None:
        await self._http.close()
