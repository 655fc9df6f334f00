"""One API server, one set of credentials, one HTTPS pool: how every request of the project
reaches the API server (`kubeapi` on threads, `list_watch` on the event loop, the `rljob` CLI).

Not the official `kubernetes` client: its generated models cost the operator's process memory
it never used (`entry`), and the operator needs plain-dict requests only. The credentials are
the `kopf.ConnectionInfo` kopf's own watches log in with (`kubeconfig`), so the two can never
authenticate differently; requests go through urllib3, as the official client sends them.

Credentials are renewed as client-go renews them: a ServiceAccount token is read again once a
minute (the kubelet rotates projected tokens); a kubeconfig login (an exec plugin's token, a
cached auth-provider token) is made again once its expiration passes or the API server answers
401, and the request is sent once more with the new credentials. A plugin's client certificate
is read at the first login only: the TLS context is made once per connection.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import kopf
import urllib3

from rljob_operator.kube.kubeconfig import (
    SERVICE_ACCOUNT_DIR,
    LoginError,
    connection_info,
    uses_service_account,
)

TOKEN_REREAD_SECONDS = 60.0
RELOGIN_MARGIN_SECONDS = 10.0  # log in again this long before a token expires

Login = Callable[[], kopf.ConnectionInfo]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    data: bytes


class ApiConnection:
    """One API server, one set of credentials, at most `connections` kept-alive HTTPS connections
    (one per thread of the `KubeApi` using it: more threads than connections pay a TLS handshake
    per call beyond them). Thread-safe: urllib3's pool is, and the token is swapped under a lock."""

    def __init__(
        self,
        info: kopf.ConnectionInfo,
        *,
        connections: int = 1,
        user_agent: str = "rljob-operator",
        token_file: Path | None = None,
        login: Login | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`token_file`: a ServiceAccount token to read again once a minute; `login`: how to log in
        again (the kubeconfig read anew) when `info`'s expiration passes or on a 401."""
        if not info.server:
            raise LoginError("the credentials name no API server")
        self.server = info.server.rstrip("/")
        self.default_namespace = info.default_namespace  # the kubeconfig context's, the pod's
        self.user_agent = user_agent
        self.connections = connections
        tls: dict[str, Any] = {}
        # Also the engine-pod watch's (aiohttp): one TLS setup for both transports.
        self.ssl_context: ssl.SSLContext | None = info.as_ssl_context() if self.server.startswith("https:") else None
        if self.ssl_context is not None:
            tls["ssl_context"] = self.ssl_context
            if info.insecure:  # urllib3 would still ask for a verified, matching certificate
                tls.update(cert_reqs="CERT_NONE", assert_hostname=False)
        self._pool = urllib3.PoolManager(num_pools=1, maxsize=connections, **tls)
        self._token_file, self._login, self._clock, self._wall = token_file, login, clock, wall
        self._lock = threading.Lock()
        self._auth = self._authorization(info.token, info)
        self._auth_read_at = clock()
        self._info = info
        self._expires_at = _timestamp(info.expiration)

    @staticmethod
    def _authorization(token: str | None, info: kopf.ConnectionInfo) -> str | None:
        if token:
            return f"{info.scheme or 'Bearer'} {token}"
        if info.username and info.password:
            pair = f"{info.username}:{info.password}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None

    def authorization(self) -> str | None:
        """The Authorization header's value now (a rotated token read again, an expired login
        made again; None: none)."""
        if self._token_file is None and self._expires_at is None:
            return self._auth
        with self._lock:
            if self._token_file is not None and self._clock() - self._auth_read_at >= TOKEN_REREAD_SECONDS:
                token = self._token_file.read_text().strip() or None
                self._auth, self._auth_read_at = self._authorization(token, self._info), self._clock()
            elif self._expires_at is not None and self._wall() >= self._expires_at - RELOGIN_MARGIN_SECONDS:
                self._relogin()
            return self._auth

    def unauthorized(self, sent: str | None) -> bool:
        """The API server answered 401 to `sent`: log in again (once for every caller that saw
        it). True when the credentials changed, so that the request is worth sending again."""
        if self._login is None:
            return False
        with self._lock:
            if self._auth == sent:
                self._relogin()
            return self._auth != sent

    def _relogin(self) -> None:
        """Under the lock. A login that fails keeps the old credentials (the API server's 401
        then says what is wrong) and is tried again at the next call."""
        if self._login is None:
            self._expires_at = None
            return
        try:
            info = self._login()
        except LoginError as e:
            log.warning("logging in again failed: %s", e)
            return
        self._info, self._auth = info, self._authorization(info.token, info)
        self._expires_at = _timestamp(info.expiration)

    def request(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """One request; a body that is not bytes is sent as JSON. Transport failures raise
        urllib3's errors (`kubeapi` makes them status 0)."""
        url = self.server + path + (f"?{urlencode(list(query))}" if query else "")
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        bound = urllib3.Timeout(total=timeout) if timeout is not None else None
        auth = self.authorization()
        r = self._send(method, url, data, headers, auth, bound)
        if r.status == 401 and self.unauthorized(auth):
            r = self._send(method, url, data, headers, self.authorization(), bound)
        return Response(r.status, r.reason or "", r.data)

    def _send(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str] | None,
        auth: str | None, bound: urllib3.Timeout | None,
    ) -> urllib3.BaseHTTPResponse:
        hdrs = {"User-Agent": self.user_agent, **(headers or {})}
        if auth:
            hdrs["Authorization"] = auth
        return self._pool.request(method, url, body=data, headers=hdrs, timeout=bound, redirect=False)

    def close(self) -> None:
        self._pool.clear()


def _timestamp(expiration: datetime | None) -> float | None:
    if expiration is None:
        return None
    return (expiration if expiration.tzinfo else expiration.replace(tzinfo=UTC)).timestamp()


def connect(
    kubeconfig: str | None = None,
    connections: int = 1,
    user_agent: str = "rljob-operator",
    *,
    user_first: bool = False,
) -> ApiConnection:
    """An `ApiConnection` with this process's credentials (`kubeconfig.connection_info`)."""
    in_pod = uses_service_account(kubeconfig, SERVICE_ACCOUNT_DIR, user_first)
    login = functools.partial(connection_info, kubeconfig, user_first=user_first)
    return ApiConnection(
        login(),
        connections=connections,
        user_agent=user_agent,
        token_file=SERVICE_ACCOUNT_DIR / "token" if in_pod else None,
        login=None if in_pod else login,
    )
