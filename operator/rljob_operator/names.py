"""Deterministic names of everything the operator creates for an RLJob.

Every child object's name is a pure function of the job's name (and, for engine pods, of
cell index, generation and pod index). That is what makes the reconciler restart-safe: a
retried handler or a freshly started operator computes the same names, so creating a cell
twice hits 409 AlreadyExists instead of doubling it (KubeRay reaches the same guarantee with
scale expectations; we get it for free from the names).

An RLJob's name is a DNS subdomain (up to 253 characters, dots allowed) while pod hostnames,
Service names and label values must be DNS labels of at most 63 characters. `dns_label`
keeps a readable prefix and appends a short hash of the full name whenever it has to
truncate or rewrite it, so two long names that share a prefix still map to different names.
"""

from __future__ import annotations

import hashlib
import re

MAX_LABEL = 63
_INVALID = re.compile(r"[^a-z0-9-]+")
_HASH_LEN = 8


def short_hash(text: str) -> str:
    """First 8 hex digits of sha256(text): stable across processes and Python versions."""
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LEN]


def dns_label(base: str, suffix: str = "", limit: int = MAX_LABEL) -> str:
    """`base + suffix` as an RFC 1035 label of at most `limit` characters.

    Unchanged when it already is one. Otherwise the base is lower-cased, characters outside
    [a-z0-9-] become '-', it is truncated, and '-<hash of base>' is appended before the
    suffix. The suffix (e.g. '-cell-3-g1-0') is kept whole: it carries the meaning.
    """
    name = base + suffix
    if len(name) <= limit and re.fullmatch(r"[a-z]([a-z0-9-]*[a-z0-9])?", name):
        return name
    clean = _INVALID.sub("-", base.lower()).strip("-")
    if not clean or not clean[0].isalpha():
        clean = "j" + clean
    room = limit - len(suffix) - _HASH_LEN - 1
    if room < 1:
        raise ValueError(f"suffix {suffix!r} leaves no room for a name within {limit} characters")
    head = clean[:room].rstrip("-") or "j"
    return f"{head}-{short_hash(base)}{suffix}"


def engine_pod_name(job: str, index: int, generation: int, pod_index: int) -> str:
    """`<job>-cell-<index>-g<generation>-<podIndex>`; also the pod's hostname."""
    return dns_label(job, f"-cell-{index}-g{generation}-{pod_index}")


def cells_service_name(job: str) -> str:
    """Headless Service giving every engine pod a DNS name (`<pod>.<job>-cells`)."""
    return dns_label(job, "-cells")


def engines_service_name(job: str) -> str:
    """Service selecting the heads of serving cells: what routers and the executor use."""
    return dns_label(job, "-engines")


def rollout_name(job: str) -> str:
    """RolloutExecutor Deployment and its Service (Ray Client port 10001)."""
    return dns_label(job, "-rollout")


def trainer_name(job: str) -> str:
    """Trainer Indexed Job and its headless Service.

    Indexed Job pods get the hostname `<job-name>-<index>`, which must fit in 63
    characters too, so the name leaves room for a five-digit index.
    """
    return dns_label(job, "-trainer", limit=MAX_LABEL - 6)


def ray_cluster_name(job: str) -> str:
    """KubeRay RayCluster; KubeRay derives `<name>-head-svc` etc., so leave room for them."""
    return dns_label(job, "-ray", limit=MAX_LABEL - 16)


def workload_name(job: str) -> str:
    """The Kueue Workload of the job: `rljob-<job>`, as Kueue names a Job's `job-<name>-<hash>`."""
    return dns_label("rljob-" + job, limit=253)


# PodSet names of the Workload (DNS labels): one per kind of pod the job runs.
PODSET_ENGINES = "engines"
PODSET_EXECUTOR = "executor"
PODSET_RAY_HEAD = "ray-head"
PODSET_RAY_WORKERS = "ray-workers"
PODSET_TRAINER = "trainer"


def ray_auth_secret_name(job: str) -> str:
    """Secret holding the job's Ray token (`RAY_AUTH_MODE=token`): executor and trainers read it."""
    return dns_label(job, "-ray-auth")


def network_policy_name(job: str, role: str) -> str:
    """NetworkPolicy guarding the job's pods of one role (`<job>-rollout-ingress`, `<job>-engine-ingress`)."""
    return dns_label(job, f"-{role}-ingress")
