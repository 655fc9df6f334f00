"""The restart budget: exponential backoff with a cap, and a hard maximum."""

from __future__ import annotations

from controller_runtime.api.spec import RestartPolicySpec
from controller_runtime.restart import RestartBudget


def test_backoff_doubles_from_the_base_and_is_capped() -> None:
    budget = RestartBudget(RestartPolicySpec(backoff_seconds=5, max_backoff_seconds=300, max_restarts=10))
    assert [budget.delay(n) for n in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]


def test_huge_restart_counts_do_not_overflow() -> None:
    budget = RestartBudget(RestartPolicySpec(backoff_seconds=5, max_backoff_seconds=300))
    assert budget.delay(10_000) == 300


def test_budget_is_spent_after_max_restarts() -> None:
    budget = RestartBudget(RestartPolicySpec(backoff_seconds=5, max_restarts=2))
    assert budget.next_restart_time(0, 100.0) == 105.0
    assert budget.next_restart_time(1, 100.0) == 110.0
    assert budget.exhausted(2)
    assert budget.next_restart_time(2, 100.0) is None


def test_zero_restarts_allowed_means_first_failure_is_final() -> None:
    assert RestartBudget(RestartPolicySpec(max_restarts=0)).exhausted(0)
