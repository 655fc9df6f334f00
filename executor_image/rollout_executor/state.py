"""Save and load the executor's position so a restarted executor resumes the dataset.

One JSON file per save (`rollout_<id>.json`, written atomically) plus `latest.json` naming the
newest, in the state directory (a volume in a cluster).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_FORMAT = 1


@dataclass(frozen=True)
class ExecutorState:
    rollout_id: int
    """The last rollout whose prompts are consumed; the next rollout starts after it."""
    dataset_epoch: int
    dataset_offset: int
    weight_version: int
    job: str = ""
    format: int = STATE_FORMAT


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_state(state_dir: str, state: ExecutorState) -> Path:
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"rollout_{state.rollout_id}.json"
    _write_atomic(path, asdict(state))
    _write_atomic(root / "latest.json", {"file": path.name})
    return path


def load_state(state_dir: str) -> ExecutorState | None:
    """The newest saved state, or None when nothing was saved yet."""
    root = Path(state_dir)
    latest = root / "latest.json"
    if not latest.is_file():
        return None
    name = json.loads(latest.read_text())["file"]
    data = json.loads((root / name).read_text())
    if data.get("format") != STATE_FORMAT:
        raise ValueError(f"executor state {root / name} has format {data.get('format')}, expected {STATE_FORMAT}")
    return ExecutorState(**data)
