"""`rljob-operator`'s entry point: three process-wide settings made before the operator's
modules are imported.

- The `kubernetes` package is hidden (`sys.modules["kubernetes"] = None`): kopf imports its
  generated models whenever they are importable, megabytes of memory in a process that talks to
  the API server only through `rljob_operator.kube`. The package stays installed for the test
  cluster's tools; kopf takes the ImportError as "not installed".
- glibc's malloc keeps its mmap and trim thresholds at their 128 KiB default instead of raising
  them to the largest buffer freed: after the first LIST of a fleet, freed memory was otherwise
  kept by the process for good.
- The cyclic GC freezes what lives as long as the process and collects its youngest generation
  every 20,000 allocations instead of 700, so that the bodies and answers the operator replaces
  every few seconds die young instead of making full collections stop the event loop.
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
