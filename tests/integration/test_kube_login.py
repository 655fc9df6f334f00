"""A kubeconfig user that logs in with an `exec` credential plugin (as EKS, GKE and AKS users
do), against the real kube-apiserver: the plugin is a script that prints an ExecCredential
holding a ServiceAccount token. The project's access layer (`rljob_operator.kube`) and the
`rljob status` command log in through it, and a token the API server refuses makes the plugin
run again."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_cli.status import status
from rljob_operator.kube.connection import connect
from rljob_operator.kube.kubeapi import KubeApi

from tests.integration.operator_harness import Kube, install_crd, make_rljob

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

V1 = "client.authentication.k8s.io/v1"


def reader(kube: Kube, name: str = "reader") -> str:
    """A ServiceAccount that may read RLJobs in the test's namespace; its token."""
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
                "rules": [{"apiGroups": ["rljob.io"], "resources": ["rljobs"], "verbs": ["get", "list"]}]})  # fmt: skip
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": kube.ns}]})  # fmt: skip
    return kube.token(name)


def exec_kubeconfig(cluster: Any, tmp_path: Path, namespace: str, tokens: list[str]) -> Path:
    """The test cluster's server and CA, and a user whose exec plugin prints `tokens` one per run
    (the last one from then on); each run is counted in `runs` beside the script."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = dict(admin["clusters"][0]["cluster"])
    if server.get("certificate-authority"):  # relative to the admin kubeconfig's directory
        server["certificate-authority"] = str(Path(cluster.kubeconfig).parent / server["certificate-authority"])
    (tmp_path / "tokens.json").write_text(json.dumps(tokens))
    plugin = tmp_path / "plugin" / "get-token"
    plugin.parent.mkdir()
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib\n"
        "here = pathlib.Path(__file__).parent\n"
        "runs = here / 'runs'\n"
        "n = int(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text(str(n + 1))\n"
        f"tokens = json.loads(pathlib.Path({str(tmp_path / 'tokens.json')!r}).read_text())\n"
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential',"
        " 'status': {'token': tokens[min(n, len(tokens) - 1)]}}))\n"
    )
    plugin.chmod(0o755)
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test", "cluster": server}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "plugin", "namespace": namespace}}],
        "users": [{"name": "plugin", "user": {"exec": {"apiVersion": V1, "command": "plugin/get-token"}}}],
    }))  # fmt: skip
    return cfg


async def whoami(kubeconfig: Path) -> str:
    """The user the API server takes the connection's requests as (a SelfSubjectReview)."""
    kube = KubeApi(connect(str(kubeconfig)), threads=1)
    try:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        out = await kube.call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review)
        return str(((out or {}).get("status") or {}).get("userInfo", {}).get("username"))
    finally:
        kube.close()


def test_an_exec_plugin_user_logs_in_and_rljob_status_reads_through_the_access_layer(
    cluster: Any, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    cfg = exec_kubeconfig(cluster, tmp_path, namespace, [reader(kube)])
    assert asyncio.run(whoami(cfg)) == f"system:serviceaccount:{namespace}:reader"
    kube.apply(make_rljob("j"))
    assert status("j", None, str(cfg)) == 0  # the namespace is the kubeconfig context's
    assert capsys.readouterr().out.startswith(f"RLJob {namespace}/j: ")
    assert status("absent", None, str(cfg)) == 1
    assert f"{namespace}/absent: no such RLJob" in capsys.readouterr().err
    assert status("j", "default", str(cfg)) == 1  # the ServiceAccount may not read there
    assert "HTTP 403" in capsys.readouterr().err


def test_a_token_the_api_server_refuses_makes_the_plugin_run_again_and_the_call_succeed(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    kube = Kube(cluster, namespace)
    cfg = exec_kubeconfig(cluster, tmp_path, namespace, ["not-a-token", reader(kube)])
    assert asyncio.run(whoami(cfg)) == f"system:serviceaccount:{namespace}:reader"
    assert (tmp_path / "plugin" / "runs").read_text() == "2"  # the login, then the one after the 401
