from typing import Any

from rljob_operator.auth import Authorizer, access_review_spec, bearer_token, decide_authentication

from controller_runtime.clock import FakeClock


class FakeReviewer:
    """Answers reviews like the API server would for a fixed token table and RBAC set."""

    def __init__(self, users: dict[str, str], allowed: set[tuple[str, str, str]]) -> None:
        self.users = users
        self.allowed = allowed
        self.token_reviews = 0
        self.access_reviews: list[dict[str, Any]] = []

    async def token_review(self, token: str) -> dict[str, Any]:
        self.token_reviews += 1
        if token not in self.users:
            return {"authenticated": False, "error": "invalid bearer token"}
        return {"authenticated": True, "user": {"username": self.users[token], "uid": "u1", "groups": ["system:serviceaccounts"]}}

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.access_reviews.append(spec)
        ra = spec["resourceAttributes"]
        ok = (spec["user"], ra["namespace"], ra["name"]) in self.allowed and ra["subresource"] == "control" and ra["verb"] == "update"
        return {"allowed": ok} if ok else {"allowed": False, "reason": "no rule"}


def make(cache: float = 10.0) -> tuple[Authorizer, FakeReviewer, FakeClock]:
    rev = FakeReviewer({"good": "system:serviceaccount:ns:trainer", "other": "system:serviceaccount:ns:nobody"},
                       {("system:serviceaccount:ns:trainer", "ns", "job")})
    clock = FakeClock()
    return Authorizer(rev, cache_seconds=cache, clock=clock), rev, clock


def test_bearer_token_parsing():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


async def test_missing_token_is_401_without_asking_the_api_server():
    a, rev, _ = make()
    d = await a.authorize(None, "ns", "job")
    assert (d.allowed, d.http_status) == (False, 401) and rev.token_reviews == 0


async def test_unknown_token_is_401():
    a, _, _ = make()
    d = await a.authorize("Bearer nope", "ns", "job")
    assert d.http_status == 401 and "invalid bearer token" in d.message


async def test_authenticated_without_role_is_403_naming_the_permission():
    a, _, _ = make()
    d = await a.authorize("Bearer other", "ns", "job")
    assert d.http_status == 403 and "rljobs/control" in d.message and "nobody" in d.message


async def test_allowed_only_for_the_bound_job():
    a, rev, _ = make()
    assert (await a.authorize("Bearer good", "ns", "job")).allowed
    assert not (await a.authorize("Bearer good", "ns", "other-job")).allowed
    ra = rev.access_reviews[0]["resourceAttributes"]
    assert ra == {"group": "rljob.io", "resource": "rljobs", "subresource": "control", "verb": "update", "namespace": "ns", "name": "job"}


async def test_answers_are_cached_until_they_expire():
    a, rev, clock = make(cache=10)
    await a.authorize("Bearer good", "ns", "job")
    await a.authorize("Bearer good", "ns", "job")
    assert rev.token_reviews == 1
    await clock.advance(11)
    await a.authorize("Bearer good", "ns", "job")
    assert rev.token_reviews == 2


async def test_review_failure_is_503_and_not_cached():
    class Broken(FakeReviewer):
        async def token_review(self, token: str) -> dict[str, Any]:
            self.token_reviews += 1
            raise ConnectionError("api down")

    rev = Broken({}, set())
    a = Authorizer(rev, clock=FakeClock())
    assert (await a.authorize("Bearer x", "ns", "job")).http_status == 503
    await a.authorize("Bearer x", "ns", "job")
    assert rev.token_reviews == 2


def test_review_spec_carries_identity_fields():
    caller = decide_authentication({"authenticated": True, "user": {"username": "u", "uid": "1", "groups": ["g"], "extra": {"k": ["v"]}}})
    spec = access_review_spec(caller, "ns", "job")
    assert spec["user"] == "u" and spec["groups"] == ["g"] and spec["uid"] == "1" and spec["extra"] == {"k": ["v"]}
