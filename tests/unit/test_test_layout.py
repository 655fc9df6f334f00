"""The test directories are not packages (pytest's rootdir import mode), so two test files with
one basename in different tiers break the collection of the whole suite: a tier's file named like
another tier's must be renamed (e.g. `test_kueue_logic.py` beside `integration/test_kueue.py`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_basename_is_unique_across_the_tiers() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            seen[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
