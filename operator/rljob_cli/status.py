"""`rljob status NAME`: an RLJob's phase, engines, weight version and lock, read from the cluster.

The same facts `kubectl describe rlj NAME` shows, laid out for a terminal; it reads the
resource's status only (the operator writes everything the controller knows there).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from rljob_operator.kube.connection import connect
from rljob_operator.kube.kubeapi import KubeApi, KubeApiError
from rljob_operator.kube.kubeconfig import LoginError

from controller_runtime.api import RLJobStatus


def render(name: str, namespace: str, obj: dict[str, Any]) -> str:
    status = RLJobStatus.model_validate(obj.get("status") or {})
    lines = [
        f"RLJob {namespace}/{name}: {status.phase}  ready {status.ready}  weights v{status.weight_version or '-'}  "
        f"rollout {status.rollout_id if status.rollout_id is not None else '-'}  restarts {status.restarts_total}",
    ]
    if status.lock is not None:
        lines.append(f"update window held by {status.lock.holder} since {status.lock.since} (expires {status.lock.expires})")
    lines.append(f"{'CELL':<28} {'STATE':<15} {'GEN':>3} {'WEIGHTS':>7} {'RESTARTS':>8}  ENDPOINT / MESSAGE")
    for e in status.engines:
        detail = e.endpoint or ""
        if e.message:
            detail = f"{detail}  {e.message}".strip()
        lines.append(f"{e.name:<28} {e.state!s:<15} {e.generation:>3} {e.weight_version or '-':>7} {e.restarts:>8}  {detail}")
    for c in status.conditions:
        lines.append(f"condition {c.type}={c.status} {c.reason}: {c.message}".rstrip(": "))
    return "\n".join(lines)


async def read_rljob(name: str, namespace: str | None, kubeconfig: str | None) -> tuple[str, dict[str, Any] | None]:
    """The RLJob as stored (None: there is none) and the namespace it was read from (the
    kubeconfig context's, else `default`), through the project's Kubernetes access layer."""
    kube = KubeApi(connect(kubeconfig, user_agent="rljob-cli", user_first=True), threads=1)
    try:
        ns = namespace or kube.api_client.default_namespace or "default"
        return ns, await kube.get_rljob(ns, name)
    finally:
        kube.close()


def status(name: str, namespace: str | None, kubeconfig: str | None) -> int:
    try:
        ns, obj = asyncio.run(read_rljob(name, namespace, kubeconfig))
    except LoginError as exc:
        print(f"rljob status: no usable kubeconfig: {exc}", file=sys.stderr)
        return 2
    except KubeApiError as exc:
        print(f"rljob status: {exc}", file=sys.stderr)
        return 1
    if obj is None:
        print(f"rljob status: {ns}/{name}: no such RLJob", file=sys.stderr)
        return 1
    print(render(name, ns, obj))
    return 0
