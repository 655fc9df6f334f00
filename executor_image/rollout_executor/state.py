"""The executor's position, saved so that a restarted executor or trainer resumes the dataset.

One JSON file per save (`rollout_<id>.json`, written atomically) plus `latest.json` naming the
newest, in the state directory (a volume in a cluster). The same state travels as plain data
inside a trainer checkpoint (`ExecutorState.to_dict`/`from_dict`), so that a trainer resumed
from step N puts the executor back where it was after rollout N-1, whether or not the
executor has a state directory.

Besides the position after the saved rollout, the state lists the *pending* rollouts: those
whose prompts were already taken (generated ahead, with overlap) but not trained when the
save happened. A restore hands them the same prompts again, regenerated on the restored
weights, so no prompt is skipped or repeated.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rljob_client.errors import RLJobError

STATE_FORMAT = 1
STATE_FILE = re.compile(r"^rollout_(\d+)\.json$")


class StateError(RLJobError, ValueError):
    """A saved state that cannot be used; the message names the file."""


@dataclass(frozen=True)
class PendingRollout:
    """A rollout whose prompts were taken but not trained: `count` prompts from (epoch, offset)."""

    rollout_id: int
    epoch: int
    offset: int
    count: int


@dataclass(frozen=True)
class ExecutorState:
    rollout_id: int
    """The last rollout whose prompts are consumed; the next rollout starts after it."""
    dataset_epoch: int
    dataset_offset: int
    weight_version: int
    job: str = ""
    format: int = STATE_FORMAT
    pending: tuple[PendingRollout, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pending"] = [asdict(p) for p in self.pending]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "executor state") -> ExecutorState:
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise StateError(f"{source} has format {found!r}, expected {STATE_FORMAT}")
        try:
            pending = tuple(PendingRollout(**p) for p in data.get("pending") or ())
            return cls(**{**data, "pending": pending})
        except TypeError as exc:
            raise StateError(f"{source} is not an executor state: {exc}") from exc


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_state(state_dir: str, state: ExecutorState, keep: int | None = None) -> Path:
    """Write `state` and point latest.json at it; with `keep`, only the newest `keep` rollout files stay."""
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"rollout_{state.rollout_id}.json"
    _write_atomic(path, state.to_dict())
    _write_atomic(root / "latest.json", {"file": path.name})
    if keep is not None:
        saved = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STATE_FILE.match(p.name)))
        for rollout_id, old in saved[:-keep]:
            if rollout_id != state.rollout_id:
                old.unlink(missing_ok=True)
    return path


def load_state(state_dir: str) -> ExecutorState | None:
    """The newest saved state, or None when nothing was saved yet."""
    root = Path(state_dir)
    latest = root / "latest.json"
    if not latest.is_file():
        return None
    name = json.loads(latest.read_text())["file"]
    return ExecutorState.from_dict(json.loads((root / name).read_text()), source=f"executor state {root / name}")
