"""The operator's process keeps glibc's malloc thresholds fixed (`rljob_operator.entry`): a large
buffer freed after another, larger one was freed goes back to the system instead of staying in
the heap. Measured in a fresh interpreter each, with and without the fix, so the test shows it
can tell the two apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Free one 8 MiB block (glibc then raises its mmap threshold to 8 MiB and its trim threshold to
# 16 MiB), then make and free a 3 MiB one: what the process still holds of it is printed, in KiB.
PROBE = """
import sys
sys.path[:0] = [{operator!r}]
if {fixed}:
    from rljob_operator.entry import fix_malloc_thresholds
    assert fix_malloc_thresholds()
def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
big = b"x" * (8 << 20)
del big
before = rss_kib()
block = b"y" * (3 << 20)
del block
print(rss_kib() - before)
"""


def held_kib(fixed: bool) -> int:
    code = PROBE.format(operator=str(ROOT / "operator"), fixed=fixed)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_a_freed_large_buffer_is_given_back_once_the_thresholds_are_fixed() -> None:
    assert held_kib(fixed=False) >= 2 * 1024, "glibc's raised threshold kept no block: the probe shows nothing"
    assert held_kib(fixed=True) < 512, "the operator's process keeps freed large buffers"
