"""Who may call the controller API: TokenReview, then SubjectAccessReview.

The caller presents its ServiceAccount token (`Authorization: Bearer ...`). The API server
says who that is (TokenReview) and whether that identity may `update` the `rljobs/control`
subresource of this job (SubjectAccessReview), so access is granted with ordinary RBAC:

    rules: [{apiGroups: [rljob.io], resources: [rljobs/control], verbs: [update]}]

Answers are cached for a few seconds per (token, job), as kube-rbac-proxy does, so a
trainer's burst of calls costs two reviews, not two per call. The decision logic is pure
(`decide_*`) and tested with fake review answers.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller_runtime.clock import Clock, RealClock
from rljob_operator.kinds import GROUP, PLURAL

log = logging.getLogger(__name__)

RESOURCE = PLURAL
SUBRESOURCE = "control"
VERB = "update"


class Reviewer(Protocol):
    async def token_review(self, token: str) -> dict[str, Any]:
        """TokenReview `status` for the token."""
        ...

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        """SubjectAccessReview `status` for the spec."""
        ...


@dataclass(frozen=True)
class Caller:
    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    http_status: int  # 200, 401, 403 or 503
    reason: str
    message: str
    caller: Caller | None = None


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def decide_authentication(status: dict[str, Any]) -> Caller | Decision:
    """A TokenReview status -> the caller, or a 401 decision."""
    if not status.get("authenticated"):
        msg = status.get("error") or "token not authenticated"
        return Decision(False, 401, "Unauthenticated", f"token review: {msg}")
    user = status.get("user") or {}
    name = user.get("username")
    if not name:
        return Decision(False, 401, "Unauthenticated", "token review returned no username")
    return Caller(
        user=name,
        uid=user.get("uid", ""),
        groups=tuple(user.get("groups") or ()),
        extra={k: list(v) for k, v in (user.get("extra") or {}).items()},
    )


def access_review_spec(caller: Caller, namespace: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": caller.user,
        "groups": list(caller.groups),
        "resourceAttributes": {
            "group": GROUP,
            "resource": RESOURCE,
            "subresource": SUBRESOURCE,
            "verb": VERB,
            "namespace": namespace,
            "name": name,
        },
    }
    if caller.uid:
        spec["uid"] = caller.uid
    if caller.extra:
        spec["extra"] = caller.extra
    return spec


def decide_authorization(status: dict[str, Any], caller: Caller, namespace: str, name: str) -> Decision:
    if status.get("allowed") and not status.get("denied"):
        return Decision(True, 200, "Allowed", status.get("reason", ""), caller)
    why = status.get("reason") or status.get("evaluationError") or "no RBAC rule allows it"
    return Decision(
        False,
        403,
        "Forbidden",
        f'{caller.user} may not update rljobs/control of "{namespace}/{name}" in group {GROUP}: {why}',
        caller,
    )


class Authorizer:
    def __init__(self, reviewer: Reviewer, cache_seconds: float = 10.0, clock: Clock | None = None) -> None:
        self.reviewer = reviewer
        self.cache_seconds = cache_seconds
        self.clock = clock or RealClock()
        self._cache: dict[tuple[str, str, str], tuple[float, Decision]] = {}

    async def authorize(self, authorization: str | None, namespace: str, name: str) -> Decision:
        token = bearer_token(authorization)
        if token is None:
            return Decision(False, 401, "Unauthenticated", "missing header Authorization: Bearer <ServiceAccount token>")
        key = (hashlib.sha256(token.encode()).hexdigest(), namespace, name)
        now = self.clock.now()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        decision = await self._review(token, namespace, name)
        if decision.http_status in (200, 401, 403) and self.cache_seconds > 0:
            self._cache[key] = (now + self.cache_seconds, decision)
            if len(self._cache) > 4096:  # bounded: drop expired entries
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        return decision

    async def _review(self, token: str, namespace: str, name: str) -> Decision:
        try:
            authn = decide_authentication(await self.reviewer.token_review(token))
            if isinstance(authn, Decision):
                return authn
            status = await self.reviewer.subject_access_review(access_review_spec(authn, namespace, name))
        except Exception as e:
            log.warning("access review failed: %r", e)
            return Decision(False, 503, "ReviewUnavailable", f"could not review the caller's access: {e}")
        return decide_authorization(status, authn, namespace, name)
