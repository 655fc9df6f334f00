"""Decoded API objects that the operator keeps for as long as a job lives, their strings shared.

`json.loads` makes a new string object for every key it decodes, so every kept RLJob body holds
its own copy of "consecutiveFailures", "lastTransitionTime" and every other key. Key strings,
and short values that repeat between jobs (cell states, condition types and reasons, "True",
timestamps of the same second), are a large share of a kept body. Interned, each such string
exists once for all jobs.

Longer strings (messages, commands) are rarely equal between jobs and are left alone: interning
a string no other object shares only adds an entry to the interpreter's table. Interned strings
are freed like any other once nothing refers to them (Python 3.11 interns them mortal).
"""

from __future__ import annotations

import sys
from typing import Any

SHARED_MAX_LEN = 32  # longer string values stay as decoded


def interned(obj: Any, max_len: int | None = SHARED_MAX_LEN) -> Any:
    """A copy of decoded JSON (dicts, lists, scalars) whose dict keys and strings of up to
    `max_len` characters (None: every string) are interned; equal to `obj`. Kept objects only:
    the walk costs about twice the decode."""
    if isinstance(obj, dict):
        return {sys.intern(k) if type(k) is str else k: interned(v, max_len) for k, v in obj.items()}
    if isinstance(obj, list):
        return [interned(v, max_len) for v in obj]
    if type(obj) is str and (max_len is None or len(obj) <= max_len):
        return sys.intern(obj)
    return obj
