"""The Pod Security Standard `restricted` for the pods whose workload allows it.

The executor, the trainer pods and the KubeRay pods need no privilege: they compute on the
CPU or on GPUs that the device plugin hands over as resources, so they run as a non-root
user with no capabilities, no privilege escalation and the runtime's default seccomp
profile, and pass a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.
Engine pods are left as they are: GPU engines commonly need what `restricted` forbids
(hostPath model caches, `IPC_LOCK` for RDMA, root in vendor images); docs/design.md says
what they need.

`NON_ROOT_UID` is the user both of our images run as (`USER 65532:65532` in the
Dockerfiles); KubeRay's pods keep the Ray image's own non-root user (1000), so only
`runAsNonRoot` is set there. `fsGroup` lets the trainer write to the checkpoints PVC.
"""

from __future__ import annotations

from typing import Any

NON_ROOT_UID = 65532


def restricted_container() -> dict[str, Any]:
    """A container's securityContext under `restricted`."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod(uid: int | None = NON_ROOT_UID) -> dict[str, Any]:
    """A pod's securityContext under `restricted`; `uid=None` keeps the image's non-root user."""
    ctx: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if uid is not None:
        ctx.update(runAsUser=uid, runAsGroup=uid, fsGroup=uid)
    return ctx
