"""A failed test's report shows the registered logs of the processes it started; a passing one's does not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

INNER = '''
from pathlib import Path
from tests.fixtures.process_logs import register

def test_fails(tmp_path):
    log = tmp_path / "op.log"
    log.write_text("".join(f"line {i}\\\\n" for i in range(500)))
    register("operator op-x", log)
    assert False, "waited for nothing"

def test_passes(tmp_path):
    log = tmp_path / "quiet.log"
    log.write_text("quiet-process-line\\\\n")
    register("operator op-y", log)
'''


def test_a_failed_tests_report_ends_with_the_tail_of_each_log_it_registered(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("-p", "tests.fixtures.process_logs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "operator op-x: last 120 lines of" in out
    assert "line 499" in out and "line 380" in out and "line 379\n" not in out  # the tail, not the whole log
    assert "quiet-process-line" not in out and "op-y" not in out  # the passing test's log is not shown
