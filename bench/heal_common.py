"""What both sides of heal_bench share: a re-opening watch and the percentiles they report.

Kept apart so that the RLJob side (heal_bench) and the KubeRay side (heal_kuberay) take their
moments the same way (watch events stamped on receipt, one monotonic clock) and read them with
the same nearest-rank percentile.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def follow(stop: threading.Event, list_fn: Any, *args: Any, on_event: Callable[[float, dict[str, Any]], None],
           **kw: Any) -> None:  # fmt: skip
    """Watch `list_fn(*args)` until `stop`, calling `on_event(receipt time, event)`; a dropped watch
    is re-opened (what is recorded is level data, so a re-list's ADDED events are harmless)."""
    from kubernetes import watch

    while not stop.is_set():
        w = watch.Watch()
        try:
            for ev in w.stream(list_fn, *args, timeout_seconds=30, _request_timeout=40, **kw):
                on_event(time.monotonic(), ev)
                if stop.is_set():
                    w.stop()
                    break
        except Exception:
            time.sleep(0.2)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with few trials p99 is the worst one, as it should be read."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def spread(values: list[float]) -> dict[str, float] | None:
    """p50 / p99 / min / max of one moment over the trials (None when no trial saw it)."""
    if not values:
        return None
    return {"p50_s": round(statistics.median(values), 3), "p99_s": round(percentile(values, 99), 3),
            "min_s": round(min(values), 3), "max_s": round(max(values), 3)}  # fmt: skip
