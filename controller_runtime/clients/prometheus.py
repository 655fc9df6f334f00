"""Parse Prometheus text exposition into {key: value} for an engine's own metrics.

An engine exports one model, so the labels that only say which engine/model (`engine`,
`model_name`) are folded away by summing. Each metric appears under its bare name (the sum
over all its samples) and, when it has other labels, also once per label set, e.g.
`vllm:engine_sleep_state{sleep_state="awake"}`: the per-state value is the information there.
Histogram buckets are skipped (their _sum/_count are kept).
"""

from __future__ import annotations

import math
import re

FOLDED_LABELS = frozenset({"engine", "model_name"})
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _split_sample(line: str) -> tuple[str, str, str] | None:
    """(name, label text, value text) of one sample line, or None when it is not one."""
    if "{" in line:
        name, _, rest = line.partition("{")
        labels, sep, value = rest.rpartition("}")
        if not sep:
            return None
        return name.strip(), labels, value
    name, _, value = line.partition(" ")
    return name.strip(), "", value


def parse_prometheus(text: str, prefix: str = "") -> dict[str, float]:
    """Samples whose metric name starts with `prefix`: totals by name, and by non-folded labels."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _split_sample(line)
        if sample is None:
            continue
        name, labels, value_text = sample
        if not name.startswith(prefix) or name.endswith("_bucket"):
            continue
        fields = value_text.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
        kept = [f'{k}="{v}"' for k, v in _LABEL.findall(labels) if k not in FOLDED_LABELS]
        if kept:
            key = f"{name}{{{','.join(kept)}}}"
            out[key] = out.get(key, 0.0) + value
    return out
