"""`rljob-operator`'s entry point: the operator's process runs without the `kubernetes` package,
and with glibc's malloc returning large freed buffers to the system.

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
"""

from __future__ import annotations

import ctypes
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


def keep_kubernetes_out() -> None:
    if "kubernetes" not in sys.modules:
        sys.modules["kubernetes"] = None  # type: ignore[assignment]


def main() -> int:
    fix_malloc_thresholds()
    keep_kubernetes_out()
    from rljob_operator.main import main as run_main

    return run_main()
