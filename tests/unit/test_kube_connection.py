"""The API server connection (`kube.connection`, `kube.kubeconfig`): where its credentials come
from (exec plugins and cached auth-provider tokens included), what its requests carry, how an
expired login is renewed, and that the operator's process runs without the `kubernetes` package.

The requests go to a real HTTP server on loopback; the credentials are files written here. The
connection against the real API server (TLS, client certificates) is what every integration
test of the operator runs on."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from rljob_operator.kube.connection import (
    RELOGIN_MARGIN_SECONDS,
    TOKEN_REREAD_SECONDS,
    ApiConnection,
    connect,
)
from rljob_operator.kube.kubeconfig import LoginError, connection_info

ROOT = Path(__file__).resolve().parents[2]


def write_kubeconfig(path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://127.0.0.1:6443"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "rl"}}],
        "users": [{"name": "u", "user": user}],
    }))  # fmt: skip
    return path


def service_account(root: Path, token: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "token").write_text(token + "\n")
    (root / "namespace").write_text("rljob-system")
    return root


def test_kubeconfig_file_paths_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    """As client-go reads them (kopf's own reader left them relative to the working directory)."""
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "token").write_text("from-file\n")
    cfg = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"client-certificate": "pki/admin.crt", "client-key": "pki/admin.key", "tokenFile": "pki/token"},
        {"server": "https://127.0.0.1:6443", "certificate-authority": "pki/ca.crt"},
    )
    info = connection_info(str(cfg))
    assert (info.ca_path, info.certificate_path, info.private_key_path) == (
        str(tmp_path / "pki" / "ca.crt"), str(tmp_path / "pki" / "admin.crt"), str(tmp_path / "pki" / "admin.key"))  # fmt: skip
    assert info.token == "from-file"
    assert info.default_namespace == "rl"


def test_an_unknown_context_or_a_missing_plugin_is_refused_with_the_file_and_what_is_missing(tmp_path: Path) -> None:
    cfg = write_kubeconfig(tmp_path / "kubeconfig", {"exec": {
        "command": "rljob-no-such-plugin", "apiVersion": "client.authentication.k8s.io/v1",
        "installHint": "install it from the vendor"}})  # fmt: skip
    with pytest.raises(LoginError, match=r"kubeconfig: user 'u' exec plugin: 'rljob-no-such-plugin' not found \(install it"):
        connection_info(str(cfg))
    cfg.write_text(cfg.read_text().replace("current-context: c", "current-context: nope"))
    with pytest.raises(LoginError, match="no context named 'nope'"):
        connection_info(str(cfg))


def test_an_explicit_kubeconfig_wins_then_the_service_account_then_kubeconfig_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = service_account(tmp_path / "sa", "sa-token")
    env_cfg = write_kubeconfig(tmp_path / "env", {"token": "env-token"})
    monkeypatch.setenv("KUBECONFIG", str(env_cfg))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    explicit = write_kubeconfig(tmp_path / "explicit", {"token": "explicit-token"})
    assert connection_info(str(explicit), service_account=sa).token == "explicit-token"
    in_pod = connection_info(None, service_account=sa)
    assert (in_pod.token, in_pod.server, in_pod.default_namespace) == ("sa-token", "https://[fd00::1]:443", "rljob-system")
    assert connection_info(None, service_account=tmp_path / "absent").token == "env-token"
    assert connection_info(None, service_account=sa, user_first=True).token == "env-token"  # kubectl's order
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert connection_info(None, service_account=sa, user_first=True).token == "sa-token"


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                          "body": self.rfile.read(length) if length else b""})  # fmt: skip
        status = 404 if self.path.startswith("/missing") else 200
        if self.headers.get("Authorization") == "Bearer stale":  # a login the API server no longer takes
            status = 401
        payload = json.dumps({"ok": status == 200}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_requests_carry_the_credentials_the_agent_and_json_and_a_rotated_token_is_read_again(
    server: str, tmp_path: Path
) -> None:
    sa = service_account(tmp_path / "sa", "first")
    now = [0.0]
    info = connection_info(str(write_kubeconfig(tmp_path / "k", {"token": "first"}, {"server": server + "/"})))
    conn = ApiConnection(info, user_agent="rljob-operator/op-a", token_file=sa / "token", clock=lambda: now[0])
    r = conn.request("PATCH", "/apis/rljob.io/v1alpha1/namespaces/rl/rljobs/j/status",
                     [("fieldManager", "rljob-operator"), ("force", "true")], {"status": {"a": 1}},
                     {"Content-Type": "application/merge-patch+json"}, timeout=5)  # fmt: skip
    assert (r.status, json.loads(r.data)) == (200, {"ok": True})
    (sa / "token").write_text("second\n")  # the kubelet rotated it
    now[0] = TOKEN_REREAD_SECONDS - 1
    conn.request("GET", "/api/v1/pods")
    now[0] = TOKEN_REREAD_SECONDS
    conn.request("GET", "/api/v1/pods")
    assert conn.request("DELETE", "/missing").status == 404
    first = Recorder.seen[0]
    assert first["path"] == "/apis/rljob.io/v1alpha1/namespaces/rl/rljobs/j/status?fieldManager=rljob-operator&force=true"
    assert first["headers"]["User-Agent"] == "rljob-operator/op-a"
    assert first["headers"]["Content-Type"] == "application/merge-patch+json"
    assert json.loads(first["body"]) == {"status": {"a": 1}}
    assert [s["headers"]["Authorization"] for s in Recorder.seen] == [
        "Bearer first", "Bearer first", "Bearer second", "Bearer second"]  # fmt: skip


def test_basic_credentials_are_sent_when_there_is_no_token(server: str, tmp_path: Path) -> None:
    cfg = write_kubeconfig(tmp_path / "k", {"username": "admin", "password": "pw"}, {"server": server})
    connect(str(cfg)).request("GET", "/api")
    assert Recorder.seen[0]["headers"]["Authorization"] == "Basic YWRtaW46cHc="


def test_an_expired_login_is_made_again_before_the_request_and_a_401_once_after_it(
    server: str, tmp_path: Path
) -> None:
    """As client-go treats an exec plugin's credential: used until its expiration, renewed on a
    401 and the request sent once more; a login that gives the same token is not resent."""
    logins: list[str] = []
    tokens = iter(["second", "stale", "third", "third", "third"])

    def login() -> kopf.ConnectionInfo:
        logins.append("login")
        return kopf.ConnectionInfo(server=server, token=next(tokens), expiration=datetime.fromtimestamp(now[0] + 1_000, UTC))

    now = [0.0]
    first = kopf.ConnectionInfo(server=server, token="first", expiration=datetime.fromtimestamp(1_000, UTC))
    conn = ApiConnection(first, login=login, wall=lambda: now[0])
    assert conn.request("GET", "/a").status == 200  # valid: no login
    now[0] = 1_000 - RELOGIN_MARGIN_SECONDS  # about to expire
    assert conn.request("GET", "/b").status == 200
    now[0] = 1_990 - RELOGIN_MARGIN_SECONDS  # expires again: the login gives a token refused (401)
    assert conn.request("GET", "/c").status == 200  # sent again with the next login's
    assert conn.request("GET", "/d").status == 200
    assert [(r["path"], r["headers"]["Authorization"]) for r in Recorder.seen] == [
        ("/a", "Bearer first"), ("/b", "Bearer second"), ("/c", "Bearer stale"), ("/c", "Bearer third"),
        ("/d", "Bearer third")]  # fmt: skip
    assert len(logins) == 3


def test_a_401_with_static_credentials_is_answered_as_it_came(server: str, tmp_path: Path) -> None:
    cfg = write_kubeconfig(tmp_path / "k", {"token": "stale"}, {"server": server})
    assert connect(str(cfg)).request("GET", "/a").status == 401  # the kubeconfig read again: same token
    assert len(Recorder.seen) == 1


def test_a_failed_login_keeps_the_old_credentials_for_the_api_server_to_refuse(server: str) -> None:
    def login() -> kopf.ConnectionInfo:
        raise LoginError("the plugin is gone")

    info = kopf.ConnectionInfo(server=server, token="stale", expiration=datetime.fromtimestamp(0, UTC))
    assert ApiConnection(info, login=login).request("GET", "/a").status == 401


def test_the_operators_process_runs_without_the_kubernetes_package() -> None:
    """kopf imports `kubernetes.client` whenever it can: 18 MiB of RSS the operator never uses.
    The console script's target is run as the installed `rljob-operator` runs it, to `--help`."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["rljob-operator"]
    module, func = target.split(":")
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'"
        " and sys.modules[m] is not None), 'kopf' in sys.modules))\n"
        f"from {module} import {func} as main\n"
        "sys.argv = ['rljob-operator', '--help']\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "LOADED [] True" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
