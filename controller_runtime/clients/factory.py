"""Pick the client class for an engine kind: the only place that branches on the engine."""

from __future__ import annotations

import aiohttp

from controller_runtime.api.spec import Engine
from controller_runtime.clients.http import DEFAULT_TIMEOUT_S
from controller_runtime.clients.sglang import SGLangClient
from controller_runtime.clients.vllm import VLLMClient
from controller_runtime.ports import EngineClient


def make_engine_client(
    engine: Engine | str,
    endpoint: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    session: aiohttp.ClientSession | None = None,
) -> EngineClient:
    """A client for `endpoint` speaking `engine`'s API (vllm | sglang)."""
    kind = Engine(engine)
    if kind is Engine.vllm:
        return VLLMClient(endpoint, timeout=timeout, session=session)
    return SGLangClient(endpoint, timeout=timeout, session=session)
