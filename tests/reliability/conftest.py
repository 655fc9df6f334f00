"""Fixtures the reliability suite shares with the other tiers (one definition each)."""

from tests.integration.test_helm_chart import helm  # noqa: F401  (the real helm binary, as a fixture)
