"""Who may drive a job through the controller API, end to end over HTTP against a real operator
and the real kube-apiserver's TokenReview and SubjectAccessReview.

Faults: a call without a token, with garbage, with a ServiceAccount token minted for another
audience, with an expired one, from a ServiceAccount of another namespace that holds the same
Role there, and from the trainer of job A against job B. Expectation: 401 for the first four,
403 for the last two, each with its reason and a message that says why; the trainer of job A
is served. Then nothing secret (any of those tokens, the job's Ray token) appears in the
operator's log, the RLJob's status, the namespace's Events or the operator's /metrics.

The trainer's client follows its token file as the kubelet rotates it (issue 12): it is served
with one token, refused once the file holds a wrong-audience token, and served again once the
file holds a freshly minted one, without being rebuilt.

The expired token is the trainer's own token re-signed with the cluster's ServiceAccount
signing key and an `exp` an hour ago (the API server refuses to mint one that short); the
same token re-signed with a future `exp` is served, so the refusal is the expiry alone.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from rljob_client.controller_client import ControllerUnauthenticated, InferenceControllerClient

from tests.integration.operator_harness import (
    Kube,
    OperatorProcess,
    call,
    control_rbac,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)
from tests.unit.test_token_file import rotate

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def signing_key(cluster: Any) -> bytes:
    path = Path(cluster.cache) / "kwok" / "clusters" / cluster.name / "pki" / "admin.key"
    assert path.exists(), f"the test cluster's ServiceAccount signing key is not at {path}"
    return path.read_bytes()


def resigned(token: str, key: bytes, exp_in: float) -> str:
    """`token`'s claims and key id, signed again with `key`, expiring `exp_in` seconds from now."""
    header = jwt.get_unverified_header(token)
    claims = jwt.decode(token, options={"verify_signature": False})
    now = int(time.time())
    claims.update(iat=now - 7200, nbf=now - 7200, exp=int(now + exp_in))
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": header.get("kid")})


def other_namespace_token(cluster: Any, namespace: str, job: str) -> str:
    """A `trainer` ServiceAccount of `namespace` allowed to control an RLJob named `job` there."""
    cluster.kubectl("create", "namespace", namespace)
    kube = Kube(cluster, namespace)
    cluster.wait_for(lambda: kube.get("serviceaccount", "default") is not None, 60, what=f"{namespace} ready")
    token, _ = control_rbac(kube, job)
    return token


def refusal(api: str, namespace: str, job: str, token: str | None) -> tuple[int, str, str]:
    code, body, _ = call(api, namespace, job, "cells", token=token, timeout=30)
    return code, body.get("reason", ""), body.get("error", "")


async def follow_rotations(api: str, namespace: str, token_file: Path, tokens: list[str]) -> list[str]:
    """One client, its token file rotated (atomically, as the kubelet does) before each call:
    what each call got ("ok" or the refusal's reason)."""
    client = InferenceControllerClient(api, "job-a", namespace, token_file=token_file, retry_timeout=0.0)
    seen = []
    try:
        for token in tokens:
            rotate(token_file, token)
            try:
                await client.cells()
                seen.append("ok")
            except ControllerUnauthenticated as exc:
                seen.append(exc.reason)
    finally:
        await client.close()
    return seen


def test_bad_tokens_are_refused_with_a_reason_and_no_secret_leaks(cluster, namespace, tmp_path):
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    trainer, nobody = control_rbac(kube, "job-a")  # the Role names job-a only
    for name in ("job-a", "job-b"):
        kube.apply(make_rljob(name, replicas=1))
    elsewhere = f"{namespace}-b"[:63]
    op = OperatorProcess(cluster, namespace, tmp_path)
    try:
        foreign = other_namespace_token(cluster, elsewhere, "job-a")
        key = signing_key(cluster)
        expired, fresh = resigned(trainer, key, -3600), resigned(trainer, key, 3600)
        other_audience = cluster.kubectl("create", "token", "trainer", "-n", namespace,
                                         "--audience", "https://not-the-api-server.example").stdout.strip()  # fmt: skip
        wait_for(lambda: call(op.api, namespace, "job-a", "cells", token=trainer, timeout=30)[0] == 200, 120,
                 what="the trainer of job-a is served")  # fmt: skip
        assert call(op.api, namespace, "job-a", "cells", token=fresh)[0] == 200, (
            "a re-signed live token is valid"
        )

        cases = {
            "missing": (None, "job-a", 401, "missing header Authorization"),
            "garbage": ("not-a-token", "job-a", 401, "token review"),
            "other audience": (other_audience, "job-a", 401, "audience"),
            "expired": (expired, "job-a", 401, "expired"),
            "other namespace": (foreign, "job-a", 403, f"system:serviceaccount:{elsewhere}:trainer may not"),
            "other job": (trainer, "job-b", 403, f'may not update rljobs/control of "{namespace}/job-b"'),
            "unbound": (nobody, "job-a", 403, f"system:serviceaccount:{namespace}:nobody may not"),
        }
        for case, (token, job, status, why) in cases.items():
            code, reason, message = refusal(op.api, namespace, job, token)
            want = "Unauthenticated" if status == 401 else "Forbidden"
            assert (code, reason) == (status, want), f"{case}: {code} {reason} {message}"
            assert why in message, f"{case}: the message does not say why: {message!r}"

        rotated = kube.token("trainer")  # the kubelet's next token for the same ServiceAccount
        assert rotated != trainer
        got = asyncio.run(follow_rotations(op.api, namespace, tmp_path / "token", [trainer, other_audience, rotated]))
        assert got == ["ok", "Unauthenticated", "ok"], "the client did not follow its rotated token file"

        secret = kube.get("secret", "job-a-ray-auth")
        assert secret is not None, "the operator made the job's Ray token Secret"
        ray_token = base64.b64decode(secret["data"]["token"]).decode()
        secrets = {"trainer": trainer, "nobody": nobody, "foreign": foreign, "expired": expired,
                   "other audience": other_audience, "ray": ray_token}  # fmt: skip
        seen = {
            "operator log": op.log_path.read_text(errors="replace"),
            "status": json.dumps([kube.status(n) for n in ("job-a", "job-b")]),
            "events": cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout,
            "metrics": op.metrics(),
        }
        for where, text in seen.items():
            for what, value in secrets.items():
                # a JWT's signature is its secret part: no log may carry it, nor the whole token
                assert value.rsplit(".", 1)[-1] not in text, f"the {what} token appears in the {where}"
    finally:
        op.stop()
        release_rljobs(cluster, namespace)
        cluster.kubectl("delete", "namespace", elsewhere, "--wait=false", check=False)
