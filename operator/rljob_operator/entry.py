"""`rljob-operator`'s entry point: the operator's process runs without the `kubernetes` package,
with glibc's malloc returning large freed buffers to the system, and with a cyclic garbage
collector that does not walk the whole heap every few seconds.

kopf imports `kubernetes.client` at its own import whenever it can (to recognise the client's
model classes, `kopf._cogs.helpers.thirdparty`), and those generated models were 18 MiB of the
operator's RSS in a process that never builds one: the operator talks to the API server through
`kubeconn`. A `None` in `sys.modules` makes every later `import kubernetes` raise ImportError,
which kopf takes as "not installed". The package stays installed for the `rljob` CLI and the
test cluster's agent; only this process goes without it, so this runs before kopf is imported.

glibc's malloc raises its mmap threshold to the size of every large block freed (up to 32 MiB),
and its heap-trim threshold to twice that: after the operator's first LIST of a fleet (one
buffer of megabytes) every later large buffer, a response or its decoding, came from the heap,
and what was freed between long-lived objects stayed in the process. At N=300 RLJobs a
`malloc_trim` at rest gave back 17 of 138 MiB; with both thresholds fixed at glibc's default
128 KiB it gave back 0.5 MiB, and the peak RSS at N=1,000 was 254-265 against 311-316 MiB, kopf's
bodies without managedFields included (bench/RESULTS.md). Fixing a threshold
is `mallopt`, as the `MALLOC_MMAP_THRESHOLD_` variable would, set here so that every way of
starting the operator gets it. Other C libraries are left as they are.

The price: asyncio reads every socket into a fresh 256 KiB buffer (`recv(max_size)`, shrunk to
what came), which at this threshold is an mmap and an munmap each, ~9 us per small read against
~0.8 us from the heap (a send and a recv of 300 bytes on a socketpair), as glibc does anyway
until its first large free raises the threshold. Fixed at 1 MiB instead, reads come from the
heap but the N=300 operator kept 12 MiB that `malloc_trim` could give back and peaked at
131.7 MiB against 118.2 at 128 KiB: the buffers of those reads were what stayed behind.

CPython's cyclic collector promotes any container that outlives 700 net allocations (its
youngest generation's threshold) toward the oldest generation, and walks every tracked object
of the process in a full collection once those promoted since the last one exceed a quarter of
the rest. The operator keeps, for seconds to minutes, objects it replaces later: kopf's latest
body of each RLJob, each job's last written status, decoded watch events and answers. They all
reach the oldest generation and die there, so at N=1,000 RLJobs full collections came every
few seconds with the event loop stopped: a probe in the operator's process counted 86 in a
6-minute run, 40 s in all, up to 1.0 s each, and 17 stops of the loop over 0.5 s. Here the
objects that live as long as the process (the modules, classes and functions imported before
the operator starts, ~67,000) are frozen out of every collection (`gc.freeze`), and the youngest
generation is collected every 20,000 net allocations instead of 700, so that what a watch event
or a request makes dies young, uncounted. The next run on the same cluster with both: 2 full
collections (0.9 s), one stop over 0.5 s, the ramp's operator CPU 111.7 -> 100.9 CPU-s, 60 s at
rest 28.8 -> 24.9, peak RSS 242.9 -> 229.9 MiB (bench/RESULTS.md). A collection of the youngest
generation then looks at up to 20,000 objects, a few milliseconds; the older thresholds stay
CPython's.
"""

from __future__ import annotations

import ctypes
import gc
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
FIXED_THRESHOLD_BYTES = 128 * 1024  # glibc's own default, without its raising


def fix_malloc_thresholds() -> bool:
    """Whether glibc's malloc now keeps both thresholds fixed (module docstring)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library; no `find_library` subprocess
    except AttributeError:  # a C library without it
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, FIXED_THRESHOLD_BYTES) == 1 for param in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))


YOUNG_GC_THRESHOLD = 20_000  # CPython's default: 700 (module docstring)


def tune_gc() -> None:
    """Freeze what is alive now (call once the operator's modules are imported) and raise the
    youngest generation's threshold (module docstring)."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, middle, oldest)


def keep_kubernetes_out() -> None:
    if "kubernetes" not in sys.modules:
        sys.modules["kubernetes"] = None  # type: ignore[assignment]


def main() -> int:
    fix_malloc_thresholds()
    keep_kubernetes_out()
    from rljob_operator.main import main as run_main

    tune_gc()
    return run_main()
