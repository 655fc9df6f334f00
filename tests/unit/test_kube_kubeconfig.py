"""How a kubeconfig becomes credentials (`kube.kubeconfig`): files of `$KUBECONFIG` merged as
client-go merges them, exec credential plugins (a real script run here, as `aws eks get-token`
or `gke-gcloud-auth-plugin` would be) and the token-bearing auth-provider shapes."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_operator.kube.kubeconfig import ExecPlugin, LoginError, connection_info

V1 = "client.authentication.k8s.io/v1"


def kubeconfig(path: Path, user: dict[str, Any], **extra: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority-data": "Q0E="}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "rl"}}],
        "users": [{"name": "u", "user": user}], **extra,
    }))  # fmt: skip
    return path


def plugin_script(path: Path, credential: dict[str, Any] | str, exit_code: int = 0) -> Path:
    """A plugin that records what it was given (argv, env) next to itself and prints `credential`."""
    printed = credential if isinstance(credential, str) else json.dumps(credential)
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"open({str(path) + '.seen'!r}, 'w').write(json.dumps({{'argv': sys.argv[1:], 'region': os.environ.get('REGION'),"
        " 'info': json.loads(os.environ['KUBERNETES_EXEC_INFO']), 'stdin_tty': sys.stdin.isatty()}))\n"
        f"print({printed!r})\n"
        "print('a warning for people', file=sys.stderr)\n"
        f"sys.exit({exit_code})\n"
    )
    path.chmod(0o755)
    return path


def credential(status: dict[str, Any], api_version: str = V1) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "ExecCredential", "status": status}


def test_an_exec_plugin_is_run_without_a_terminal_and_its_token_and_expiry_are_the_login(tmp_path: Path) -> None:
    """The command is found relative to the kubeconfig (it has a path separator), gets its args,
    its env and KUBERNETES_EXEC_INFO (with the cluster: provideClusterInfo)."""
    (tmp_path / "bin").mkdir()
    plugin_script(tmp_path / "bin" / "get-token",
                  credential({"token": "tok-1", "expirationTimestamp": "2030-01-02T03:04:05Z"}))  # fmt: skip
    cfg = kubeconfig(tmp_path / "config", {"exec": {
        "apiVersion": V1, "command": "bin/get-token", "args": ["--cluster", "c1"],
        "env": [{"name": "REGION", "value": "eu-1"}], "provideClusterInfo": True, "interactiveMode": "IfAvailable"}})  # fmt: skip
    info = connection_info(str(cfg))
    assert (info.token, info.expiration, info.server) == (
        "tok-1", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC), "https://127.0.0.1:6443")  # fmt: skip
    seen = json.loads((tmp_path / "bin" / "get-token.seen").read_text())
    assert seen["argv"] == ["--cluster", "c1"] and seen["region"] == "eu-1" and not seen["stdin_tty"]
    assert seen["info"] == {"apiVersion": V1, "kind": "ExecCredential", "spec": {
        "interactive": False, "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="}}}  # fmt: skip


def test_an_exec_plugin_may_answer_a_client_certificate_instead_of_a_token(tmp_path: Path) -> None:
    plugin_script(tmp_path / "p", credential({"clientCertificateData": "CERT", "clientKeyData": "KEY"},
                                             "client.authentication.k8s.io/v1beta1"))  # fmt: skip
    cfg = kubeconfig(tmp_path / "config", {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                    "command": str(tmp_path / "p")}})  # fmt: skip
    info = connection_info(str(cfg))
    assert (info.token, info.certificate_data, info.private_key_data, info.expiration) == (None, "CERT", "KEY", None)


@pytest.mark.parametrize(
    ("printed", "exit_code", "message"),
    [
        (credential({"token": "t"}, "client.authentication.k8s.io/v1beta1"), 0, "answered apiVersion .*v1beta1'.*asked .*v1'"),
        (credential({}), 0, "neither status.token nor status.clientCertificateData"),
        ("not json", 0, "its output is not JSON"),
        ({"kind": "Secret"}, 0, "not an ExecCredential"),
        (credential({"token": "t", "expirationTimestamp": "soon"}), 0, "expirationTimestamp: 'soon' is not an RFC 3339 time"),
        (credential({"token": "t"}), 3, "exited 3: a warning for people"),
    ],
)
def test_what_a_plugin_answers_wrong_is_named(tmp_path: Path, printed: Any, exit_code: int, message: str) -> None:
    plugin_script(tmp_path / "p", printed, exit_code)
    cfg = kubeconfig(tmp_path / "config", {"exec": {"apiVersion": V1, "command": str(tmp_path / "p")}})
    with pytest.raises(LoginError, match=f"user 'u' exec plugin: .*{message}"):
        connection_info(str(cfg))


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}, "exec.apiVersion .*v1alpha1' is not one of"),
        ({"apiVersion": V1}, "exec.command is not set"),
        ({"command": "x", "apiVersion": V1, "interactiveMode": "Always"}, "interactiveMode Always needs a terminal"),
    ],
)
def test_an_exec_section_a_controller_cannot_run_is_refused_by_its_field(section: dict[str, Any], message: str) -> None:
    with pytest.raises(LoginError, match=message):
        ExecPlugin.parse(section, Path("/"), "cfg: user 'u'")


def test_a_static_token_wins_over_a_plugin_which_is_then_never_run(tmp_path: Path) -> None:
    cfg = kubeconfig(tmp_path / "config", {"token": "static", "exec": {"apiVersion": V1, "command": "/nonexistent"}})
    assert connection_info(str(cfg)).token == "static"


def test_auth_provider_tokens_cached_in_the_kubeconfig_are_read_and_others_are_named_unsupported(tmp_path: Path) -> None:
    oidc = {"auth-provider": {"name": "oidc", "config": {"id-token": "id.jwt", "refresh-token": "r",
                                                          "idp-issuer-url": "https://issuer"}}}  # fmt: skip
    assert connection_info(str(kubeconfig(tmp_path / "a", oidc))).token == "id.jwt"
    gcp = {"auth-provider": {"name": "gcp", "config": {"access-token": "ya29", "expiry": "2030-01-01T00:00:00Z"}}}
    info = connection_info(str(kubeconfig(tmp_path / "b", gcp)))
    assert (info.token, info.expiration) == ("ya29", datetime(2030, 1, 1, tzinfo=UTC))
    cases = [
        ({"name": "oidc", "config": {"refresh-token": "r"}}, "auth-provider 'oidc': no config.id-token"),
        ({"name": "gcp", "config": {}}, "auth-provider 'gcp': no cached config.access-token; use gke-gcloud-auth-plugin"),
        ({"name": "azure", "config": {"access-token": "x"}}, "auth-provider 'azure': unsupported"),
    ]
    for provider, message in cases:
        with pytest.raises(LoginError, match=message):
            connection_info(str(kubeconfig(tmp_path / "c", {"auth-provider": provider})))


def test_every_kubeconfig_file_is_merged_first_one_wins_and_paths_are_relative_to_their_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "token").write_text("from-two\n")
    (tmp_path / "one" / "config").write_text(yaml.safe_dump({
        "current-context": "work",
        "contexts": [{"name": "work", "context": {"cluster": "prod", "user": "me"}}],
        "clusters": [{"name": "prod", "cluster": {"server": "https://one:6443", "certificate-authority": "ca.crt"}}],
    }))  # fmt: skip
    (tmp_path / "two" / "config").write_text(yaml.safe_dump({
        "current-context": "other",
        "clusters": [{"name": "prod", "cluster": {"server": "https://two:6443"}}],
        "users": [{"name": "me", "user": {"tokenFile": "token"}}],
    }))  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'one' / 'config'}:{tmp_path / 'absent'}:{tmp_path / 'two' / 'config'}")
    info = connection_info(None, service_account=tmp_path / "no-sa")
    assert (info.server, info.ca_path, info.token) == ("https://one:6443", str(tmp_path / "one" / "ca.crt"), "from-two")
