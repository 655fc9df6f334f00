"""The operator-wide relist (rljob_operator/relist.py): the pure plan, and the loop on fakes.

The cluster test (tests/reliability/test_api_faults.py, dropped watch events) runs the same
code against a real API server; these pin each rule without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rljob_operator.delivered import Delivered, record_delivered
from rljob_operator.reconcile.job_runtime import newer_body
from rljob_operator.relist import NUDGE_ANNOTATION, Relister, plan


def rljob(
    name: str, generation: int = 1, uid: str | None = None, rv: str = "1", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": uid or f"u-{name}", "generation": generation,
                            "resourceVersion": rv}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"g": generation}}


def test_a_listed_job_goes_to_its_runtime_and_only_a_higher_generation_wins() -> None:
    watched = {("ns", "a"): rljob("a", 2)}
    p = plan([rljob("a", 3)], watched, frozenset(), {})
    assert p.feed == {("ns", "a"): rljob("a", 3)} and not p.nudge and not p.maybe_gone and not p.behind
    assert newer_body(rljob("a", 2), rljob("a", 3))["spec"] == {"g": 3}
    assert newer_body(rljob("a", 3), rljob("a", 2))["spec"] == {
        "g": 3
    }  # a stale list never undoes a newer spec
    assert newer_body(rljob("a", 2), rljob("a", 2, rv="9")) is not None
    assert newer_body(rljob("a", 2), None)["spec"] == {"g": 2}


def test_a_job_kopf_never_reported_is_nudged_on_the_second_list_only() -> None:
    first = plan([rljob("new", rv="7")], {}, frozenset(), {})
    assert first.behind == {("ns", "new")} and not first.nudge  # the ADDED event may be on its way
    second = plan([rljob("new", rv="8")], {}, first.behind, {})
    assert second.nudge == {("ns", "new"): "8"} and second.behind == {("ns", "new")}
    caught_up = plan([rljob("new", rv="9")], {("ns", "new"): rljob("new")}, second.behind, {})
    assert not caught_up.nudge and not caught_up.behind


def test_a_deletion_kopf_did_not_see_is_nudged_and_a_deleting_job_without_runtime_is_not() -> None:
    watched = {("ns", "d"): rljob("d")}
    first = plan([rljob("d", deleting=True)], watched, frozenset(), {})
    assert first.behind == {("ns", "d")} and not first.nudge
    assert plan([rljob("d", deleting=True, rv="5")], watched, first.behind, {}).nudge == {("ns", "d"): "5"}
    # kopf saw the deletion and its daemon ended: nothing to make up
    assert not plan([rljob("d", deleting=True)], {}, frozenset({("ns", "d")}), {}).behind


def test_a_runtime_whose_job_is_not_listed_or_was_replaced_may_be_gone() -> None:
    watched = {("ns", "old"): rljob("old"), ("ns", "same"): rljob("same"), ("ns", "kept"): rljob("kept")}
    p = plan([rljob("same", uid="u-other"), rljob("kept")], watched, frozenset(), {})
    assert p.maybe_gone == (("ns", "old"), ("ns", "same"))
    assert p.behind == {("ns", "same")}  # the new object of that name has no runtime yet
    assert set(p.feed) == {("ns", "kept")}


def test_a_job_whose_event_kopf_delivered_is_never_nudged_while_its_daemon_is_spawned() -> None:
    """After an operator restart with many jobs, kopf spawns about one daemon a second: a job
    whose event arrived can show no runtime on two lists in a row. Its event was not lost:
    no nudge (the old rule wrote one on every such job)."""
    delivered: dict[tuple[str, str], Delivered] = {}
    record_delivered(delivered, None, rljob("slow", rv="7"))  # kopf's first list: type None
    first = plan([rljob("slow", rv="7")], {}, frozenset(), delivered)
    second = plan([rljob("slow", rv="8")], {}, frozenset({("ns", "slow")}), delivered)
    assert not first.behind and not second.behind and not second.nudge
    # an event of an earlier object of that name proves nothing of this one
    replaced = plan([rljob("slow", uid="u-new")], {}, frozenset({("ns", "slow")}), delivered)
    assert replaced.nudge == {("ns", "slow"): "1"}


def test_a_deletion_kopf_delivered_is_not_nudged_and_one_it_did_not_is() -> None:
    watched = {("ns", "d"): rljob("d")}  # the runtime's view still lacks the deletion mark
    delivered: dict[tuple[str, str], Delivered] = {}
    record_delivered(delivered, "MODIFIED", rljob("d"))
    assert plan([rljob("d", deleting=True)], watched, frozenset({("ns", "d")}), delivered).nudge == {("ns", "d"): "1"}
    record_delivered(delivered, "MODIFIED", rljob("d", deleting=True))
    assert not plan([rljob("d", deleting=True)], watched, frozenset({("ns", "d")}), delivered).behind


def test_a_deleted_event_or_a_job_no_longer_listed_ends_its_record() -> None:
    delivered: dict[tuple[str, str], Delivered] = {}
    record_delivered(delivered, "ADDED", rljob("a"))
    record_delivered(delivered, "ADDED", rljob("b"))
    record_delivered(delivered, "DELETED", rljob("a", uid="u-other"))  # another object's: kept
    assert set(delivered) == {("ns", "a"), ("ns", "b")}
    record_delivered(delivered, "DELETED", rljob("a"))
    assert set(delivered) == {("ns", "b")}
    assert plan([], {}, frozenset(), delivered).forget == (("ns", "b"),)


class FakeRuntime:
    def __init__(self, body: Mapping[str, Any]) -> None:
        self.watched = body
        self.listed: list[Mapping[str, Any]] = []
        self.ended = False

    def observe_listed(self, body: Mapping[str, Any]) -> None:
        self.listed.append(body)

    def end(self) -> None:
        self.ended = True


class FakeKube:
    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs
        self.calls: list[tuple[str, Any]] = []

    async def list_rljobs(self, namespace: str | None) -> list[dict[str, Any]]:
        self.calls.append(("list", namespace))
        return [j for j in self.jobs if namespace is None or j["metadata"]["namespace"] == namespace]

    async def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", name))
        return next((j for j in self.jobs if j["metadata"]["name"] == name), None)

    async def annotate_rljob(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.calls.append(("annotate", (name, annotations)))


async def test_one_list_per_round_for_every_job_and_a_get_only_to_confirm_a_gone_one() -> None:
    kube = FakeKube([rljob(f"j{i}", 2) for i in range(100)] + [rljob("lost", rv="42")])
    runtimes = {("ns", f"j{i}"): FakeRuntime(rljob(f"j{i}", 1)) for i in range(100)}
    runtimes[("ns", "deleted")] = FakeRuntime(rljob("deleted"))
    relister = Relister(kube, runtimes, ["ns"], period=30.0)
    await relister.once()
    assert kube.calls == [("list", "ns"), ("get", "deleted")]  # not 100 GETs
    assert all(rt.listed == [rljob(k[1], 2)] for k, rt in runtimes.items() if k[1] != "deleted")
    assert runtimes[("ns", "deleted")].ended and not runtimes[("ns", "j0")].ended
    kube.calls.clear()
    await relister.once()
    assert kube.calls == [
        ("list", "ns"),
        ("annotate", ("lost", {NUDGE_ANNOTATION: "42"})),
        ("get", "deleted"),
    ]
    assert relister.nudges == 1


async def test_the_loop_nudges_only_jobs_kopf_never_delivered_and_forgets_gone_ones() -> None:
    """100 jobs listed, none with a runtime yet (kopf spawning their daemons), 99 of them
    delivered by kopf's watch: two lists nudge only the one never delivered."""
    kube = FakeKube([rljob(f"j{i}") for i in range(100)])
    delivered: dict[tuple[str, str], Delivered] = {}
    for i in range(99):
        record_delivered(delivered, None, rljob(f"j{i}"))
    record_delivered(delivered, "ADDED", rljob("gone"))  # its DELETED event was lost
    relister = Relister(kube, {}, ["ns"], period=30.0, delivered=delivered)
    await relister.once()
    await relister.once()
    assert [c for c in kube.calls if c[0] == "annotate"] == [("annotate", ("j99", {NUDGE_ANNOTATION: "1"}))]
    assert relister.nudges == 1 and ("ns", "gone") not in delivered and len(delivered) == 99


async def test_a_job_the_get_still_finds_is_not_ended() -> None:
    """A list that lacks a job (a cache behind) never stops its runtime: the GET decides."""
    kube = FakeKube([rljob("live")])
    runtimes = {("ns", "live"): FakeRuntime(rljob("live"))}

    async def stale_list(namespace: str | None) -> list[dict[str, Any]]:
        return []

    kube.list_rljobs = stale_list  # type: ignore[method-assign]
    await Relister(kube, runtimes, [None], period=30.0).once()
    assert kube.calls == [("get", "live")] and not runtimes[("ns", "live")].ended
