"""The operator's process freezes its imported objects out of the cyclic collector and collects
its youngest generation less often (`rljob_operator.entry.tune_gc`), so that objects a watch
event or a request makes die young instead of filling the oldest generation, whose full
collections stopped the event loop for up to a second at N=1,000 RLJobs. Each case runs in a
fresh interpreter, with and without the tuning, so the test shows it can tell the two apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# After the operator's imports: an object that lives through 5,000 allocations of containers
# (a few watch events' worth), and how many objects a full collection would then walk.
PROBE = """
import gc, json, sys
sys.path[:0] = [{operator!r}]
import rljob_operator.main
if {tuned}:
    from rljob_operator.entry import tune_gc
    tune_gc()
gc.collect()
young = [[]]
kept = [[] for _ in range(5000)]
print(json.dumps({{"still_young": any(o is young for o in gc.get_objects(0)),
                  "walked_by_full_collection": len(gc.get_objects())}}))
"""

# `rljob-operator` itself, with the operator's run replaced by a report of the collector's state.
ENTRY = """
import gc, json, sys
sys.path[:0] = [{operator!r}]
import rljob_operator.main as operator_main
operator_main.main = lambda: print(json.dumps({{"young_threshold": gc.get_threshold()[0],
                                                "frozen": gc.get_freeze_count()}})) or 0
from rljob_operator.entry import main
sys.exit(main())
"""


def run(code: str, tuned: bool = True) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code.format(operator=str(ROOT / "operator"), tuned=tuned)],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_short_lived_object_stays_young_and_imports_are_not_walked_once_tuned() -> None:
    default, tuned = run(PROBE, tuned=False), run(PROBE)
    assert default["still_young"] is False, "CPython's default threshold kept it young: the probe shows nothing"
    assert tuned["still_young"] is True, "an object that lived through 5,000 allocations was already promoted"
    assert isinstance(default["walked_by_full_collection"], int) and isinstance(tuned["walked_by_full_collection"], int)
    assert default["walked_by_full_collection"] > 30_000, default
    assert tuned["walked_by_full_collection"] < default["walked_by_full_collection"] // 4, (default, tuned)


def test_the_operators_entry_point_tunes_the_collector_before_it_runs() -> None:
    state = run(ENTRY)
    assert state["young_threshold"] == 20_000, state
    assert isinstance(state["frozen"], int) and state["frozen"] > 30_000, state
