"""The rollout function API: what a `spec.rollout.function` is given and what it returns.

A rollout function is `async def rollout(client: EngineClient, row: PromptRow, **args)`,
called once per sample (or once per prompt with `row.n` samples wanted, when
`spec.rollout.functionPerGroup` is set). It returns one `RolloutSample` (per-group: a list of
`row.n`). A sample without a reward is scored by `spec.rollout.reward`. Single-turn
generation, the default, is `single_turn` below: the same path every custom function takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rljob_client.errors import RLJobError

from rollout_executor.samples import SampleKey

if TYPE_CHECKING:
    from rollout_executor.engine_client import EngineClient


class MalformedSample(RLJobError):
    """A rollout function returned something that is not a valid sample; the message says what."""


@dataclass(frozen=True)
class PromptRow:
    """The dataset row a rollout function works on."""

    key: SampleKey  # per group: the group's first sample
    index: int  # row in the dataset file
    text: str  # the prompt field as text ("" for chat rows)
    messages: list[dict[str, Any]] | None  # chat rows (spec.rollout.dataset.format: chat)
    label: Any
    record: dict[str, Any]
    n: int = 1  # samples wanted from this call


@dataclass
class RolloutSample:
    """One trajectory. `loss_mask`, `logprobs` and `weight_versions` are per response token.

    The response may interleave generated tokens with tool or environment output: mask the
    latter with 0 (its logprobs are then ignored). `weight_versions` defaults to the version
    of the engine call that made the sample; `metadata` (JSON) reaches the trainer in the
    batch's meta.
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int] | None = None
    weight_versions: list[int] | None = None
    reward: float | None = None
    response: str = ""
    finish_reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    engine: str = ""


def check_sample(s: Any, default_version: int | None) -> RolloutSample:
    """The sample validated (lengths agree, versions known), or MalformedSample saying what is wrong."""
    if not isinstance(s, RolloutSample):
        raise MalformedSample(f"returned {type(s).__name__}, not a RolloutSample")
    n = len(s.response_token_ids)
    if not s.prompt_token_ids:
        raise MalformedSample("no prompt_token_ids")
    if len(s.logprobs) != n:
        raise MalformedSample(f"{len(s.logprobs)} logprobs for {n} response tokens")
    if s.loss_mask is not None and len(s.loss_mask) != n:
        raise MalformedSample(f"loss_mask of {len(s.loss_mask)} for {n} response tokens")
    if s.weight_versions is not None and len(s.weight_versions) != n:
        raise MalformedSample(f"weight_versions of {len(s.weight_versions)} for {n} response tokens")
    if s.weight_versions is None and default_version is None:
        raise MalformedSample("no weight_versions and no engine call to take them from")
    if s.reward is not None:
        try:
            r = float(s.reward)
        except (TypeError, ValueError) as e:
            raise MalformedSample(f"reward {s.reward!r} is not a number") from e
        if r != r or r in (float("inf"), float("-inf")):
            raise MalformedSample(f"reward {r} is not finite")
    return s


async def single_turn(client: EngineClient, row: PromptRow) -> RolloutSample:
    """Today's rollout: one completion of the prompt (chat rows through the chat template), scored by the reward."""
    c = await (client.chat(row.messages) if row.messages is not None else client.generate(row.text))
    return RolloutSample(
        prompt_token_ids=c.prompt_token_ids, response_token_ids=c.token_ids, logprobs=c.logprobs,
        response=c.text, finish_reason=c.finish_reason, engine=c.engine,
        weight_versions=None,  # the call's version: the executor fills it from the client
    )


DEFAULT_FUNCTION = "rollout_executor.rollout_api:single_turn"
