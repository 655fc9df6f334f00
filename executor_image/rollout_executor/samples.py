"""What a generated sample is, and how it is identified.

A sample is identified by (rollout_id, group, sample): `group` is the prompt's slot in the
rollout, `sample` its index inside the GRPO group. The executor stores each key once, so a
retried or duplicated engine answer can never add a second copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple


class SampleKey(NamedTuple):
    rollout_id: int
    group: int
    sample: int

    def __str__(self) -> str:
        return f"rollout {self.rollout_id} group {self.group} sample {self.sample}"


@dataclass(frozen=True)
class VocabInfo:
    """What a reward may need to know about the tokenizer, without loading one."""

    vocab_size: int
    special_ids: frozenset[int] = frozenset()

    @classmethod
    def from_model_dir(cls, path: str) -> VocabInfo | None:
        """vocab_size from config.json; special ids from tokenizer.json's added tokens.

        Reads JSON only, so the executor image needs no tokenizer library. None when the
        directory has no config.json.
        """
        root = Path(path)
        cfg = root / "config.json"
        if not cfg.is_file():
            return None
        vocab_size = int(json.loads(cfg.read_text())["vocab_size"])
        special: set[int] = set()
        tok = root / "tokenizer.json"
        if tok.is_file():
            for t in json.loads(tok.read_text()).get("added_tokens", []):
                if t.get("special"):
                    special.add(int(t["id"]))
        return cls(vocab_size=vocab_size, special_ids=frozenset(special))


@dataclass(frozen=True)
class RewardInput:
    """Everything a reward function is given about one sample."""

    key: SampleKey
    prompt: str
    response: str
    label: Any = None
    prompt_token_ids: tuple[int, ...] = ()
    response_token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    vocab: VocabInfo | None = None
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    key: SampleKey
    prompt_index: int
    prompt: str
    label: Any
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    response: str
    finish_reason: str | None
    weight_version: int
    engine: str
    reward: float | None = None
    record: dict[str, Any] = field(default_factory=dict)
    loss_mask: list[int] | None = None  # per response token; None: every token is trained on
    token_weight_versions: list[int] | None = None  # per response token, when not all `weight_version`
    metadata: dict[str, Any] = field(default_factory=dict)  # the rollout function's, for the trainer

    def reward_input(self, vocab: VocabInfo | None) -> RewardInput:
        return RewardInput(
            key=self.key,
            prompt=self.prompt,
            response=self.response,
            label=self.label,
            prompt_token_ids=tuple(self.prompt_token_ids),
            response_token_ids=tuple(self.response_token_ids),
            finish_reason=self.finish_reason,
            vocab=vocab,
            record=self.record,
        )
