"""A client for an engine: the engine table's (`controller_runtime.engines`), never a default."""

from __future__ import annotations

import aiohttp

from controller_runtime.clients.http import DEFAULT_TIMEOUT_S
from controller_runtime.engines import engine
from controller_runtime.ports import EngineClient


def make_engine_client(
    kind: str,
    endpoint: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    session: aiohttp.ClientSession | None = None,
) -> EngineClient:
    """A client for `endpoint` speaking `kind`'s API; an engine without a row raises UnknownEngine."""
    return engine(kind).make_client(endpoint, timeout=timeout, session=session)
