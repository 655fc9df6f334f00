"""The restart budget: exponential backoff, a cap, and a maximum count per cell.

Pure arithmetic over `RestartPolicySpec`, so the controller's healing can never turn into
an unbounded crash loop: after `maxRestarts` charged recreations a cell is Failed.
"""

from __future__ import annotations

from controller_runtime.api.spec import RestartPolicySpec

_MAX_EXPONENT = 62  # 2**62 * any sane backoff is far past any cap; avoids float overflow


class RestartBudget:
    def __init__(self, spec: RestartPolicySpec) -> None:
        self.spec = spec

    def delay(self, restarts_so_far: int) -> float:
        """Seconds before the next recreation: min(backoff * 2**n, maxBackoff)."""
        n = min(max(0, restarts_so_far), _MAX_EXPONENT)
        return min(self.spec.backoff_seconds * (2.0**n), self.spec.max_backoff_seconds)

    def exhausted(self, restarts_so_far: int) -> bool:
        return restarts_so_far >= self.spec.max_restarts

    def next_restart_time(self, restarts_so_far: int, now: float) -> float | None:
        """When the next recreation is due, or None when the budget is spent."""
        if self.exhausted(restarts_so_far):
            return None
        return now + self.delay(restarts_so_far)
