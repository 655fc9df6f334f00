"""The history checks themselves, on made-up audit histories: each catches what it is for."""

from __future__ import annotations

from typing import Any

from tests.reliability import history as H


def ev(at: int, verb: str, resource: str, name: str, code: int = 200, *, sub: str = "", agent: str = "rljob-operator/op-a",
       body: dict[str, Any] | None = None) -> H.Event:  # fmt: skip
    return H.Event(f"2026-01-01T00:00:{at:02d}Z", verb, resource, sub, "ns", name, code, agent, body or {})


def lease(at: int, holder: str) -> H.Event:
    return ev(at, "update", "leases", "rljob-operator-leader", body={"spec": {"holderIdentity": holder}})


def test_a_second_pod_in_a_slot_before_the_first_was_deleted_is_caught() -> None:
    ok = [ev(1, "create", "pods", "j-cell-0-g0-0", 201), ev(2, "delete", "pods", "j-cell-0-g0-0"),
          ev(3, "create", "pods", "j-cell-0-g1-0", 201), ev(3, "create", "pods", "j-cell-0-g1-1", 201)]  # fmt: skip
    assert H.one_live_pod_per_slot(ok) == []
    doubled = [ev(1, "create", "pods", "j-cell-0-g0-0", 201), ev(2, "create", "pods", "j-cell-0-g1-0", 201)]
    assert H.one_live_pod_per_slot(doubled) == [
        "2026-01-01T00:00:02Z: j-cell-0-g1-0 created while ['j-cell-0-g0-0'] still live"
    ]


def test_a_child_created_after_the_jobs_deletion_is_caught() -> None:
    events = [ev(1, "create", "rljobs", "j", 201), ev(2, "delete", "rljobs", "j"), ev(3, "patch", "services", "j-engines", 201),
              ev(4, "patch", "services", "j-rollout", 200)]  # fmt: skip
    assert len(H.nothing_created_after_deletion(events)) == 1  # the 201 (a create), not the 200 (an update)
    recreated = [
        ev(1, "delete", "rljobs", "j"),
        ev(2, "create", "rljobs", "j", 201),
        ev(3, "create", "pods", "j-cell-0-g0-0", 201),
    ]
    assert H.nothing_created_after_deletion(recreated) == []


def test_observed_generation_going_back_is_caught() -> None:
    def status(at: int, gen: int | None) -> H.Event:
        return ev(
            at,
            "patch",
            "rljobs",
            "j",
            sub="status",
            body={"status": {} if gen is None else {"observedGeneration": gen}},
        )

    assert H.observed_generation_never_goes_back([status(1, 1), status(2, None), status(3, 2)]) == []
    assert len(H.observed_generation_never_goes_back([status(1, 2), status(2, 1)])) == 1
    recreated = [status(1, 4), ev(2, "delete", "rljobs", "j"), ev(3, "create", "rljobs", "j", 201), status(4, 1)]
    assert H.observed_generation_never_goes_back(recreated) == []


def test_a_write_by_a_replica_that_does_not_hold_the_lease_is_caught() -> None:
    ok = [lease(1, "op-a"), ev(2, "create", "pods", "j-cell-0-g0-0", 201), lease(3, "op-b"),
          ev(4, "delete", "pods", "j-cell-0-g0-0", agent="rljob-operator/op-b")]  # fmt: skip
    assert H.only_the_lease_holder_writes(ok) == []
    stale = [lease(1, "op-b"), ev(2, "patch", "pods", "j-cell-0-g0-0", agent="rljob-operator/op-a")]
    assert len(H.only_the_lease_holder_writes(stale)) == 1


def test_restarts_that_differ_from_the_recreations_seen_are_caught() -> None:
    events = [ev(1, "create", "pods", "j-cell-0-g0-0", 201), ev(2, "create", "pods", "j-cell-0-g1-0", 201)]
    assert (
        H.restarts_match_recreations(events, {"j": {"engines": [{"name": "j-cell-0", "restarts": 1}]}}) == []
    )
    assert H.restarts_match_recreations(
        events, {"j": {"engines": [{"name": "j-cell-0", "restarts": 0}]}}
    ) == ["j-cell-0: restarts 0, recreations seen 1"]
    recreated_job = [*events, ev(3, "delete", "rljobs", "j"), ev(4, "create", "rljobs", "j", 201),
                     ev(5, "create", "pods", "j-cell-0-g0-0", 201)]  # fmt: skip
    assert H.restarts_match_recreations(recreated_job, {"j": {"engines": [{"name": "j-cell-0", "restarts": 0}]}}) == []
