"""One engine's HTTP transport: every request has a total timeout and fails with a typed error.

The controller must never hang on an engine and must be able to tell "engine is gone" from
"engine is slow" from "engine said no" from "engine said nonsense", because each leads to a
different decision (restart the cell, retry, report, report). This module maps aiohttp's
failures onto controller_runtime.errors once, so the engine clients above it only speak routes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import aiohttp

from controller_runtime.clients.probe import Target, probe
from controller_runtime.errors import (
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
)

DEFAULT_TIMEOUT_S = 30.0

Params = Mapping[str, str] | Sequence[tuple[str, str]]

_CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class HTTPReply:
    """A successful (2xx) answer: status and body text."""

    status: int
    text: str

    def json(self, endpoint: str) -> Any:
        """The body as JSON; a body that is not JSON is a protocol error, not a crash."""
        try:
            return json.loads(self.text)
        except ValueError as exc:
            raise EngineProtocolError(endpoint, f"expected JSON, got {self.text[:200]!r}") from exc


class EngineHTTP:
    """Base URL + aiohttp session + default timeout, shared by the vLLM and SGLang clients.

    A session passed in is borrowed (the caller closes it); otherwise one is created on first
    use and closed by `close()`.
    """

    def __init__(
        self, endpoint: str, timeout: float = DEFAULT_TIMEOUT_S, session: aiohttp.ClientSession | None = None
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self._session = session
        self._owns_session = session is None
        self._probe_target = _probe_target(self.endpoint)  # parsed once: probes come every interval

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Engines are on private addresses; never let an ambient proxy setting intervene.
            self._session = aiohttp.ClientSession(trust_env=False)
            self._owns_session = True
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Params | None = None,
        timeout_s: float | None = None,
        close: bool = False,
    ) -> HTTPReply:
        """Send one request and return a 2xx reply, or raise a typed EngineError.

        `timeout_s` (default: the client's) bounds the whole exchange (connect, send, wait, read); aiohttp's own total
        timeout is backed by asyncio.timeout so that no code path can outlive it.

        `close` asks for the connection to be closed after the answer (`Connection: close`), as
        the kubelet's HTTP prober does: a periodic probe would otherwise keep one idle
        connection per cell open for good whenever its interval is below the session's
        keep-alive, memory and a descriptor each, to save a reconnect that costs little CPU.
        """
        limit = self.timeout if timeout_s is None else timeout_s
        url = f"{self.endpoint}{path}"
        try:
            async with asyncio.timeout(limit):
                async with self._client().request(
                    method,
                    url,
                    json=json_body,
                    params=params,
                    headers=_CLOSE if close else None,
                    timeout=aiohttp.ClientTimeout(total=limit),
                ) as resp:
                    text = await resp.text(errors="replace")
                    status = resp.status
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise EngineTimeout(self.endpoint, f"{method} {path}: no answer within {limit:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnavailable(self.endpoint, f"{method} {path}: {exc}") from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise EngineUnavailable(self.endpoint, f"{method} {path}: server disconnected") from exc
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
            # A reply that is not valid HTTP (bad status line, broken chunking): the thing on
            # that port is not the engine we expect.
            raise EngineProtocolError(self.endpoint, f"{method} {path}: malformed reply: {exc}") from exc
        except aiohttp.ClientOSError as exc:
            raise EngineUnavailable(self.endpoint, f"{method} {path}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise EngineProtocolError(self.endpoint, f"{method} {path}: {exc!r}") from exc
        if status >= 400:
            raise EngineHTTPError(self.endpoint, status, text)
        return HTTPReply(status, text)

    async def probe(self, path: str, timeout_s: float | None = None) -> None:
        """A health probe of `path`: a status below 400, or the typed error `request` raises.

        Made by `clients.probe` (a connection of its own, closed after the reply, as the
        kubelet's prober does) without the session: it is the call the operator makes most,
        and aiohttp's per-request work was most of its cost (`clients/probe.py`). An endpoint
        that is not plain http goes through `request`."""
        limit = self.timeout if timeout_s is None else timeout_s
        if self._probe_target is None:
            await self.request("GET", path, timeout_s=limit, close=True)
            return
        await probe(self.endpoint, path, limit, self._probe_target)

    async def get_json(
        self, path: str, *, params: Params | None = None, timeout_s: float | None = None
    ) -> Any:
        reply = await self.request("GET", path, params=params, timeout_s=timeout_s)
        return reply.json(self.endpoint)

    async def post_json(
        self, path: str, body: Any = None, *, params: Params | None = None, timeout_s: float | None = None
    ) -> Any:
        reply = await self.request("POST", path, json_body=body, params=params, timeout_s=timeout_s)
        return reply.json(self.endpoint)

    async def close(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _probe_target(endpoint: str) -> Target | None:
    """Where `clients.probe` connects; None for an endpoint it does not take (https), whose
    probes go through the session."""
    try:
        return Target.of(endpoint)
    except ValueError:
        return None


def expect_object(endpoint: str, route: str, value: Any) -> dict[str, Any]:
    """The route promises a JSON object; anything else is a protocol error."""
    if not isinstance(value, dict):
        raise EngineProtocolError(endpoint, f"{route}: expected a JSON object, got {type(value).__name__}")
    return value


T = TypeVar("T")


@overload
def expect_field(endpoint: str, route: str, obj: Any, key: str, kind: type[T]) -> T: ...


@overload
def expect_field(endpoint: str, route: str, obj: Any, key: str, kind: tuple[type[Any], ...]) -> Any: ...


def expect_field(endpoint: str, route: str, obj: Any, key: str, kind: type[Any] | tuple[type[Any], ...]) -> Any:
    """obj[key], checked to be of `kind`; a missing or mistyped field is a protocol error."""
    body = expect_object(endpoint, route, obj)
    if key not in body:
        raise EngineProtocolError(endpoint, f"{route}: reply lacks {key!r}: {str(body)[:200]}")
    value = body[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        raise EngineProtocolError(endpoint, f"{route}: {key!r} has type {type(value).__name__}")
    return value
