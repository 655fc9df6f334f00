"""What a resourceVersion says: the API server's answers compared by when they were made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def list_version(result: Mapping[str, Any] | None) -> int | None:
    """A LIST's resourceVersion as a number (etcd's revision), None when it is not one."""
    rv = ((result or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(rv) if rv is not None else None
    except (TypeError, ValueError):
        return None
