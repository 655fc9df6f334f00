"""Whose credentials every process of the project logs in with, in client-go's order.

An explicit kubeconfig (`--kubeconfig`), else the pod's ServiceAccount (the operator; the `rljob`
CLI asks for the user's files first, as kubectl does), else every file of
`$KUBECONFIG` merged (client-go's rules: the first file that names a cluster, context or user
wins, and the first `current-context` set), else `~/.kube/config`. Paths in a kubeconfig are
relative to the file that holds them.

A kubeconfig user may log in with a token, a token file, a client certificate, basic auth, an
`exec` credential plugin (how EKS, GKE and AKS users log in: `aws eks get-token`,
`gke-gcloud-auth-plugin`, `kubelogin`), or an `auth-provider` whose token is cached in the
kubeconfig (`oidc`'s id-token, `gcp`'s access-token). A plugin's token expires: the result
carries its expiration, and a connection logs in again past it or on a 401 (`connection`),
as kopf does with the same `kopf.ConnectionInfo` (`handlers.login`). An auth-provider this
cannot read (`azure`, an `oidc` without an id-token) is refused with a message naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_SECONDS = 60.0  # a plugin that asks for input waits forever; client-go has no bound


class LoginError(kopf.LoginError):
    """No usable credentials: the message says which file and what is missing."""


def in_cluster_info(root: Path = SERVICE_ACCOUNT_DIR) -> kopf.ConnectionInfo | None:
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


@dataclass(frozen=True)
class Entry:
    """A named cluster, context or user, with the directory its relative paths start from."""

    body: Mapping[str, Any]
    base: Path


@dataclass
class Kubeconfig:
    """One or more kubeconfig files merged as client-go merges them."""

    sources: tuple[Path, ...]
    current_context: str | None
    clusters: dict[str, Entry]
    contexts: dict[str, Entry]
    users: dict[str, Entry]

    @classmethod
    def load(cls, paths: Sequence[Path]) -> Kubeconfig:
        merged = cls(tuple(paths), None, {}, {}, {})
        for path in paths:
            if not path.exists():  # client-go skips a missing file of $KUBECONFIG
                continue
            config = yaml.safe_load(path.read_text()) or {}
            if not isinstance(config, dict):
                raise LoginError(f"{path}: not a kubeconfig (a YAML mapping)")
            merged.current_context = merged.current_context or config.get("current-context") or None
            for section, into in (("clusters", merged.clusters), ("contexts", merged.contexts), ("users", merged.users)):
                for item in config.get(section) or []:
                    name = item.get("name")
                    if name is not None and name not in into:
                        into[name] = Entry(dict(item.get(section[:-1]) or {}), path.parent)
        return merged

    def where(self) -> str:
        return os.pathsep.join(str(p) for p in self.sources)

    def named(self, section: str, name: str | None) -> Entry:
        entry = getattr(self, section).get(name)
        if entry is None:
            raise LoginError(
                f"{self.where()}: no {section[:-1]} named {name!r} (current-context {self.current_context!r})"
            )
        return entry

    def connection_info(self, context_name: str | None = None) -> kopf.ConnectionInfo:
        """The credentials of `context_name` (None: the current context); runs an exec plugin."""
        current = context_name or self.current_context
        if not current:
            raise LoginError(f"{self.where()}: current-context is not set")
        context = self.named("contexts", current).body
        cluster_entry, user_entry = self.named("clusters", context.get("cluster")), self.named("users", context.get("user"))
        cluster, user = cluster_entry.body, user_entry.body
        base = user_entry.base
        token = user.get("token")
        if user.get("tokenFile") and not token:
            token = Path(_relative(base, user["tokenFile"]) or "").read_text().strip()
        cert: str | None = user.get("client-certificate-data")
        key: str | None = user.get("client-key-data")
        expiration: datetime | None = None
        has_certificate = bool(user.get("client-certificate") or cert)
        where = f"{self.where()}: user {context.get('user')!r}"
        if not (token or has_certificate):
            if user.get("exec"):
                plugin = ExecPlugin.parse(user["exec"], base, where)
                got = plugin.run(cluster if plugin.provide_cluster_info else None)
                token, expiration = got.token, got.expiration
                cert, key = got.certificate_data or cert, got.private_key_data or key
            elif user.get("auth-provider"):
                token, expiration = auth_provider_token(user["auth-provider"], where)
        return kopf.ConnectionInfo(
            server=str(cluster.get("server") or ""),
            ca_path=_relative(cluster_entry.base, cluster.get("certificate-authority")),
            ca_data=cluster.get("certificate-authority-data"),
            insecure=cluster.get("insecure-skip-tls-verify"),
            certificate_path=_relative(base, user.get("client-certificate")),
            certificate_data=cert,
            private_key_path=_relative(base, user.get("client-key")),
            private_key_data=key,
            username=user.get("username"),
            password=user.get("password"),
            token=token,
            default_namespace=context.get("namespace"),
            expiration=expiration,
        )


def _relative(base: Path, path: str | None) -> str | None:
    """Kubeconfig file paths are relative to the kubeconfig's own directory."""
    return None if not path else str(base / os.path.expanduser(path))


def parse_time(value: Any, what: str) -> datetime | None:
    """An RFC 3339 time (a plugin's expirationTimestamp, a cached token's expiry); None: none."""
    if not value:
        return None
    try:
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as e:
        raise LoginError(f"{what}: {value!r} is not an RFC 3339 time") from e
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ExecResult:
    token: str | None
    certificate_data: str | None
    private_key_data: str | None
    expiration: datetime | None


@dataclass(frozen=True)
class ExecPlugin:
    """A kubeconfig user's `exec` section: a command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    api_version: str
    install_hint: str
    provide_cluster_info: bool
    where: str

    @classmethod
    def parse(cls, section: Mapping[str, Any], base: Path, where: str) -> ExecPlugin:
        where = f"{where} exec plugin"
        command = str(section.get("command") or "")
        if not command:
            raise LoginError(f"{where}: exec.command is not set")
        api_version = str(section.get("apiVersion") or "")
        if api_version not in EXEC_API_VERSIONS:
            raise LoginError(f"{where}: exec.apiVersion {api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}")
        if section.get("interactiveMode") == "Always":
            raise LoginError(f"{where}: exec.interactiveMode Always needs a terminal, which a controller never has")
        if os.sep in command and not os.path.isabs(command):  # client-go: relative to the kubeconfig
            command = str(base / command)
        env = tuple((str(e.get("name")), str(e.get("value") or "")) for e in section.get("env") or [])
        return cls(
            command=command,
            args=tuple(str(a) for a in section.get("args") or []),
            env=env,
            api_version=api_version,
            install_hint=str(section.get("installHint") or ""),
            provide_cluster_info=bool(section.get("provideClusterInfo")),
            where=where,
        )

    def run(self, cluster: Mapping[str, Any] | None = None, timeout: float = EXEC_TIMEOUT_SECONDS) -> ExecResult:
        """Run the plugin without a terminal and read the ExecCredential it prints."""
        spec: dict[str, Any] = {"interactive": False}
        if cluster is not None:
            spec["cluster"] = {k: v for k, v in {
                "server": cluster.get("server"),
                "certificate-authority-data": cluster.get("certificate-authority-data"),
                "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify"),
                "config": cluster.get("extensions"),
            }.items() if v is not None}  # fmt: skip
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **dict(self.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(
                [self.command, *self.args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                text=True, timeout=timeout, check=False,
            )  # fmt: skip
        except FileNotFoundError as e:
            hint = f" ({self.install_hint.strip()})" if self.install_hint else ""
            raise LoginError(f"{self.where}: {self.command!r} not found{hint}") from e
        except subprocess.TimeoutExpired as e:
            raise LoginError(f"{self.where}: {self.command!r} gave no credential within {timeout:.0f} s") from e
        if done.returncode != 0:
            raise LoginError(f"{self.where}: {self.command!r} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return self.parse_output(done.stdout)

    def parse_output(self, stdout: str) -> ExecResult:
        try:
            cred = json.loads(stdout)
        except ValueError as e:
            raise LoginError(f"{self.where}: its output is not JSON: {stdout.strip()[:200]!r}") from e
        if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
            raise LoginError(f"{self.where}: its output is not an ExecCredential (kind)")
        if cred.get("apiVersion") != self.api_version:
            raise LoginError(f"{self.where}: it answered apiVersion {cred.get('apiVersion')!r}, asked {self.api_version!r}")
        status = cred.get("status") or {}
        token = status.get("token") or None
        cert, key = status.get("clientCertificateData") or None, status.get("clientKeyData") or None
        if not token and not (cert and key):
            raise LoginError(f"{self.where}: its ExecCredential has neither status.token nor "
                             "status.clientCertificateData with status.clientKeyData")  # fmt: skip
        return ExecResult(token, cert, key, parse_time(status.get("expirationTimestamp"), f"{self.where}: expirationTimestamp"))


def auth_provider_token(section: Mapping[str, Any], where: str) -> tuple[str, datetime | None]:
    """The token an `auth-provider` cached in the kubeconfig: `oidc`'s id-token, `gcp`'s
    access-token with its expiry. Refreshing them (an OIDC refresh-token, gcloud) is the
    provider's business: run `kubectl` once, or move to its exec plugin."""
    name = str(section.get("name") or "")
    config = section.get("config") or {}
    where = f"{where} auth-provider {name!r}"
    if name == "oidc":
        token = config.get("id-token")
        if not token:
            raise LoginError(f"{where}: no config.id-token; refreshing an OIDC token is not supported, "
                             "log in with kubectl (or kubelogin as an exec plugin) first")  # fmt: skip
        return str(token), None
    if name == "gcp":
        token = config.get("access-token")
        if not token:
            raise LoginError(f"{where}: no cached config.access-token; use gke-gcloud-auth-plugin (exec)")
        return str(token), parse_time(config.get("expiry"), f"{where}: config.expiry")
    raise LoginError(f"{where}: unsupported (only oidc's id-token and gcp's access-token are read); "
                     "use the provider's exec plugin")  # fmt: skip


def kubeconfig_paths(kubeconfig: str | None = None) -> list[Path]:
    """The files a user's kubeconfig is made of: the explicit one, else every file of
    `$KUBECONFIG`, else `~/.kube/config`."""
    if kubeconfig:
        return [Path(os.path.expanduser(kubeconfig))]
    env = [Path(os.path.expanduser(p)) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return env or [Path.home() / ".kube" / "config"]


def uses_service_account(kubeconfig: str | None, service_account: Path, user_first: bool) -> bool:
    """Whether `connection_info` takes the pod's ServiceAccount (module docstring for the order)."""
    if kubeconfig or not (service_account / "token").exists():
        return False
    return not (user_first and any(p.exists() for p in kubeconfig_paths()))


def connection_info(
    kubeconfig: str | None = None, service_account: Path = SERVICE_ACCOUNT_DIR, *, user_first: bool = False
) -> kopf.ConnectionInfo:
    """The process's credentials (module docstring for the order). `user_first`: a user's
    kubeconfig files go before the pod's ServiceAccount, as kubectl orders them (the CLI)."""
    if kubeconfig:
        path = Path(os.path.expanduser(kubeconfig))
        if not path.exists():
            raise LoginError(f"{path}: no such kubeconfig")
        return Kubeconfig.load([path]).connection_info()
    if uses_service_account(kubeconfig, service_account, user_first):
        info = in_cluster_info(service_account)
        assert info is not None
        return info
    paths = [p for p in kubeconfig_paths() if p.exists()]
    if paths:
        return Kubeconfig.load(paths).connection_info()
    raise LoginError("no credentials: not in a pod, no --kubeconfig, no $KUBECONFIG, no ~/.kube/config")
