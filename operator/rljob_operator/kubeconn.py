"""The operator's connection to the API server: whose credentials, and one HTTPS pool for them.

Why not the official `kubernetes` client: kopf imports it whenever it is importable (to recognise
its model classes and offer its login), and its generated models were 18 MiB of the operator's
RSS (imports 77 -> 59 MiB; issue 13's target is 256 MiB at 1,000 jobs). The operator used it for
two things only, loading credentials and sending plain-dict requests, and both are here: the
credentials are the same `kopf.ConnectionInfo` kopf's own watches log in with (`handlers.login`
returns `connection_info()`), so the calls and the watches can never authenticate differently,
and requests go through one urllib3 pool, the library the official client sent them with.
The operator's process keeps `kubernetes` out altogether (`entry`).

Where the credentials come from, in client-go's order: an explicit kubeconfig (`--kubeconfig`),
else the pod's ServiceAccount, else `$KUBECONFIG` or `~/.kube/config`. A ServiceAccount token is
read again once a minute: the kubelet rotates projected tokens (they live an hour), and
client-go re-reads its token file as well. A kubeconfig user with an `exec` or `auth-provider`
plugin and no token is refused with a message: running a plugin is not something this
operator does, and requests without credentials would only fail later as 401s.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import kopf
import urllib3
import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0


class LoginError(kopf.LoginError):
    """No usable credentials: the message says which file and what is missing."""


def _service_account(root: Path) -> kopf.ConnectionInfo | None:
    """In a pod: the API server by the environment the kubelet sets (as client-go's
    `InClusterConfig`), the mounted CA and token."""
    token_path = root / "token"
    if not token_path.exists():
        return None
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if host and port:
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    else:
        server = "https://kubernetes.default.svc"
    ns_path, ca_path = root / "namespace", root / "ca.crt"
    return kopf.ConnectionInfo(
        server=server,
        ca_path=str(ca_path) if ca_path.exists() else None,
        token=token_path.read_text().strip() or None,
        default_namespace=ns_path.read_text().strip() if ns_path.exists() else None,
    )


def _relative(base: Path, path: str | None) -> str | None:
    """Kubeconfig file paths are relative to the kubeconfig's own directory."""
    return None if not path else str(base / os.path.expanduser(path))


def _from_kubeconfig(path: Path) -> kopf.ConnectionInfo:
    """The current context of one kubeconfig file."""
    config = yaml.safe_load(path.read_text()) or {}

    def named(section: str, name: str | None) -> dict[str, Any]:
        for item in config.get(section) or []:
            if item.get("name") == name:
                return dict(item.get(section[:-1]) or {})
        raise LoginError(f"{path}: no {section[:-1]} named {name!r} (current-context {current!r})")

    current = config.get("current-context")
    if not current:
        raise LoginError(f"{path}: current-context is not set")
    context = named("contexts", current)
    cluster, user = named("clusters", context.get("cluster")), named("users", context.get("user"))
    token = user.get("token")
    if user.get("tokenFile") and not token:
        token = Path(_relative(path.parent, user["tokenFile"]) or "").read_text().strip()
    has_certificate = user.get("client-certificate") or user.get("client-certificate-data")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin) and not (token or has_certificate):
            raise LoginError(
                f"{path}: user {context.get('user')!r} authenticates with an {plugin} plugin, which "
                "rljob-operator does not run; give it a token, a token file or a client certificate"
            )
    return kopf.ConnectionInfo(
        server=str(cluster.get("server") or ""),
        ca_path=_relative(path.parent, cluster.get("certificate-authority")),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        certificate_path=_relative(path.parent, user.get("client-certificate")),
        certificate_data=user.get("client-certificate-data"),
        private_key_path=_relative(path.parent, user.get("client-key")),
        private_key_data=user.get("client-key-data"),
        username=user.get("username"),
        password=user.get("password"),
        token=token,
        default_namespace=context.get("namespace"),
    )


def connection_info(
    kubeconfig: str | None = None, service_account: Path = SERVICE_ACCOUNT_DIR
) -> kopf.ConnectionInfo:
    """The operator's credentials (module docstring for the order)."""
    if kubeconfig:
        return _from_kubeconfig(Path(kubeconfig))
    info = _service_account(service_account)
    if info is not None:
        return info
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    default = Path.home() / ".kube" / "config"
    if env or default.exists():
        return _from_kubeconfig(Path(os.path.expanduser(env[0])) if env else default)
    raise LoginError("no credentials: not in a pod, no --kubeconfig, no $KUBECONFIG, no ~/.kube/config")


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not info.server:
            raise LoginError("the credentials name no API server")
        self.server = info.server.rstrip("/")
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
        self._token_file, self._clock = token_file, clock
        self._lock = threading.Lock()
        self._auth = self._authorization(info.token, info)
        self._auth_read_at = clock()
        self._info = info

    @staticmethod
    def _authorization(token: str | None, info: kopf.ConnectionInfo) -> str | None:
        if token:
            return f"{info.scheme or 'Bearer'} {token}"
        if info.username and info.password:
            pair = f"{info.username}:{info.password}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None

    def authorization(self) -> str | None:
        """The Authorization header's value now (a rotated token read again; None: none)."""
        if self._token_file is None:
            return self._auth
        with self._lock:
            if self._clock() - self._auth_read_at >= TOKEN_REREAD_SECONDS:
                token = self._token_file.read_text().strip() or None
                self._auth, self._auth_read_at = self._authorization(token, self._info), self._clock()
            return self._auth

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
        hdrs = {"User-Agent": self.user_agent, **(headers or {})}
        auth = self.authorization()
        if auth:
            hdrs["Authorization"] = auth
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        bound = urllib3.Timeout(total=timeout) if timeout is not None else None
        r = self._pool.request(method, url, body=data, headers=hdrs, timeout=bound, redirect=False)
        return Response(r.status, r.reason or "", r.data)

    def close(self) -> None:
        self._pool.clear()


def connect(
    kubeconfig: str | None = None, connections: int = 1, user_agent: str = "rljob-operator"
) -> ApiConnection:
    """An `ApiConnection` with the operator's credentials (`connection_info`)."""
    in_pod = not kubeconfig and (SERVICE_ACCOUNT_DIR / "token").exists()
    return ApiConnection(
        connection_info(kubeconfig),
        connections=connections,
        user_agent=user_agent,
        token_file=SERVICE_ACCOUNT_DIR / "token" if in_pod else None,
    )
