"""`rljob status NAME`: an RLJob's phase, engines, weight version and lock, read from the cluster.

The same facts `kubectl describe rlj NAME` shows, laid out for a terminal; it reads the
resource's status only (the operator writes everything the controller knows there).
"""

from __future__ import annotations

import sys
from typing import Any, cast

from controller_runtime.api import GROUP, PLURAL, VERSION, RLJobStatus


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


def status(name: str, namespace: str | None, kubeconfig: str | None) -> int:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    try:
        config.load_kube_config(config_file=kubeconfig)
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        ns = namespace or active.get("context", {}).get("namespace") or "default"
    except Exception as exc:
        print(f"rljob status: no usable kubeconfig: {exc}", file=sys.stderr)
        return 2
    try:
        obj = client.CustomObjectsApi().get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except ApiException as exc:
        print(f"rljob status: {ns}/{name}: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    print(render(name, ns, cast("dict[str, Any]", obj)))  # a custom object is a JSON object
    return 0
