"""Prompts from a JSONL or Parquet file, shuffled deterministically per epoch, resumable.

The order of epoch `e` is a pure function of (seed, e), so the reading position
(`epoch`, `offset`) is all the state a restart needs: `PromptDataset.position` /
`seek(position)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rljob_client.errors import RLJobError


class DatasetError(RLJobError):
    """The dataset cannot be read; the message names the spec field to fix."""


@dataclass(frozen=True)
class Prompt:
    index: int
    """Row in the file (stable across epochs and restarts)."""
    text: str
    label: Any
    record: dict[str, Any]
    messages: list[dict[str, Any]] | None = None
    """Chat rows (format chat): the conversation to render with the model's chat template."""


@dataclass(frozen=True)
class Position:
    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Position:
        return cls(epoch=int(d["epoch"]), offset=int(d["offset"]))


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt:
        return str(fmt)
    if path.suffix in (".parquet", ".pq"):
        return "parquet"
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise DatasetError(
        f"spec.rollout.dataset.path {str(path)!r}: cannot tell the format from the extension; "
        "set spec.rollout.dataset.format to jsonl or parquet"
    )


def read_records(path: str, fmt: str | None = None) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"spec.rollout.dataset.path {path!r} does not exist or is not a file")
    kind = _format_of(p, None if fmt == "chat" else fmt)
    if kind == "jsonl":
        records = []
        with p.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DatasetError(f"spec.rollout.dataset.path {path!r} line {lineno}: not JSON ({e})") from e
                if not isinstance(rec, dict):
                    raise DatasetError(f"spec.rollout.dataset.path {path!r} line {lineno}: expected a JSON object")
                records.append(rec)
        return records
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    raise DatasetError(f"spec.rollout.dataset.format {kind!r} is not supported (jsonl, parquet or chat)")


def check_messages(value: Any, field: str, row: int) -> list[dict[str, Any]]:
    """A chat row's conversation: a non-empty list of {role, content}; else a DatasetError naming the field."""
    where = f"spec.rollout.dataset.messagesField {field!r} of row {row}"
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: expected a non-empty list of messages, got {type(value).__name__}")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise DatasetError(f"{where}: message {i} is not an object with role and content")
    return value


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """What a reward sees as the prompt of a chat row: the last user message's content."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return str(messages[-1].get("content", ""))


class PromptDataset:
    def __init__(
        self,
        records: list[dict[str, Any]],
        prompt_field: str = "prompt",
        label_field: str | None = "label",
        shuffle: bool = True,
        seed: int = 0,
        source: str = "<memory>",
        messages_field: str | None = None,
    ) -> None:
        if not records:
            raise DatasetError(f"spec.rollout.dataset.path {source!r} holds no prompts")
        field, spec_field = (messages_field, "messagesField") if messages_field else (prompt_field, "promptField")
        missing = [i for i, r in enumerate(records) if field not in r]
        if missing:
            raise DatasetError(
                f"spec.rollout.dataset.{spec_field} {field!r} is missing from {len(missing)} rows of "
                f"{source!r} (first: row {missing[0]})"
            )
        if messages_field:
            for i, r in enumerate(records):
                check_messages(r[messages_field], messages_field, i)
        self.messages_field = messages_field
        self._records = records
        self.prompt_field = prompt_field
        self.label_field = label_field
        self.shuffle = shuffle
        self.seed = seed
        self._pos = Position()
        self._order_cache: tuple[int, np.ndarray] | None = None

    @classmethod
    def from_path(cls, path: str, fmt: str | None = None, messages_field: str = "messages", **kwargs: Any) -> PromptDataset:
        """Chat (fmt "chat") rows carry their conversation in `messages_field`."""
        return cls(read_records(path, fmt), source=path, messages_field=messages_field if fmt == "chat" else None, **kwargs)

    def __len__(self) -> int:
        return len(self._records)

    def order(self, epoch: int) -> np.ndarray:
        """Row order of an epoch: a permutation seeded by (seed, epoch), or file order."""
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        n = len(self._records)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        self._order_cache = (epoch, order)
        return order

    def prompt(self, index: int) -> Prompt:
        rec = self._records[index]
        label = rec.get(self.label_field) if self.label_field else None
        if self.messages_field:
            messages = rec[self.messages_field]
            return Prompt(index=index, text=last_user_text(messages), label=label, record=rec, messages=messages)
        return Prompt(index=index, text=str(rec[self.prompt_field]), label=label, record=rec)

    @property
    def position(self) -> Position:
        return self._pos

    def seek(self, position: Position) -> None:
        if position.offset < 0 or position.offset > len(self._records) or position.epoch < 0:
            raise DatasetError(f"saved dataset position {position} does not fit a dataset of {len(self)} rows")
        self._pos = position

    def take(self, count: int) -> list[Prompt]:
        """The next `count` prompts, crossing into the next epoch (reshuffled) when one ends."""
        out, self._pos = self.read(self._pos, count)
        return out

    def read(self, start: Position, count: int) -> tuple[list[Prompt], Position]:
        """The `count` prompts from `start` and the position after them; the reading position stays.

        A restored rollout gets its prompts again this way: the order is a pure function of
        (seed, epoch), so a position and a count name the same prompts forever.
        """
        out: list[Prompt] = []
        epoch, offset = start.epoch, start.offset
        while len(out) < count:
            if offset >= len(self._records):
                epoch, offset = epoch + 1, 0
            order = self.order(epoch)
            take = min(count - len(out), len(order) - offset)
            out.extend(self.prompt(int(i)) for i in order[offset : offset + take])
            offset += take
        return out, Position(epoch, offset)

    def head(self, count: int) -> list[Prompt]:
        """The first `count` rows in file order (an eval set that never moves)."""
        return [self.prompt(i) for i in range(min(count, len(self._records)))]
