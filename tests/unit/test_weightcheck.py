"""Weight verification after an update names the tensors that disagree."""

from __future__ import annotations

from controller_runtime.clock import FakeClock
from controller_runtime.fakes import FakeEngine
from controller_runtime.weightcheck import changed_tensors, collect_checksums, compare_checksums


def test_agreeing_participants_pass() -> None:
    after = {"c0": {"a": "1", "b": "2"}, "c1": {"a": "1", "b": "2"}}
    assert compare_checksums(after) == {}


def test_the_deviating_cell_and_tensors_are_named() -> None:
    after = {"c0": {"a": "1", "b": "2"}, "c1": {"a": "1", "b": "X"}, "c2": {"a": "1", "b": "2"}}
    assert compare_checksums(after) == {"c1": ["b"]}


def test_a_missing_tensor_is_a_mismatch() -> None:
    after = {"c0": {"a": "1", "b": "2"}, "c1": {"a": "1", "b": "2"}, "c2": {"a": "1"}}
    assert compare_checksums(after) == {"c2": ["b"]}


def test_expected_checksums_override_the_majority() -> None:
    after = {"c0": {"a": "1"}, "c1": {"a": "1"}}
    assert compare_checksums(after, expected={"a": "2"}) == {"c0": ["a"], "c1": ["a"]}


def test_changed_tensors_counts_per_cell() -> None:
    assert changed_tensors({"c0": {"a": "1", "b": "2"}}, {"c0": {"a": "1", "b": "3"}}) == {"c0": 1}


async def test_collect_reads_every_engine() -> None:
    engines = {"c0": FakeEngine("http://0"), "c1": FakeEngine("http://1", checksums={"w": "z"})}
    assert await collect_checksums(engines, FakeClock(), 5) == {"c0": {"w": "init"}, "c1": {"w": "z"}}
