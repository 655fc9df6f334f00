"""Parse an OpenAI-style /v1/completions reply into token ids and logprobs.

RL needs the exact token ids the engine sampled and their logprobs (the trainer recomputes
the same tokens, never a re-tokenisation of the text), so a reply without them is an error
here rather than a silent fallback.

This is the one parser of completion replies: the controller's engine clients and the
RolloutExecutor's generator both use it, so "what counts as a usable completion" cannot
differ between them. Anything off in the body raises `EngineProtocolError` (never a bare
KeyError/ValueError), which callers treat as the engine's fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller_runtime.errors import EngineProtocolError


@dataclass(frozen=True)
class CompletionChoice:
    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # one per token in token_ids when requested
    finish_reason: str | None
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Completion:
    id: str
    model: str
    choices: tuple[CompletionChoice, ...]
    prompt_tokens: int
    completion_tokens: int


def _int_list(endpoint: str, where: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise EngineProtocolError(endpoint, f"{where}: expected a list of ints")
    return tuple(value)


def _logprobs(endpoint: str, where: str, value: Any, n_tokens: int) -> tuple[float, ...]:
    if not isinstance(value, dict):
        raise EngineProtocolError(endpoint, f"{where}: logprobs missing")
    lps = value.get("token_logprobs")
    if not isinstance(lps, list) or not all(isinstance(v, int | float) for v in lps):
        raise EngineProtocolError(endpoint, f"{where}: logprobs.token_logprobs is not a list of numbers")
    if len(lps) != n_tokens:
        raise EngineProtocolError(endpoint, f"{where}: {len(lps)} logprobs for {n_tokens} tokens")
    return tuple(float(v) for v in lps)


def _int(endpoint: str, where: str, value: Any, default: int) -> int:
    """Lenient like int() (an engine may send "3" or 3.0), but garbage is the engine's fault."""
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise EngineProtocolError(endpoint, f"{where}: expected an int, got {value!r:.40}") from e


def _finish_reason(endpoint: str, where: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise EngineProtocolError(endpoint, f"{where}: finish_reason is not a string")
    return value


def parse_completion(endpoint: str, body: Any, *, want_logprobs: bool) -> Completion:
    """Turn the JSON body into a Completion, or raise EngineProtocolError naming what is off."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise EngineProtocolError(endpoint, "completions: reply has no 'choices' list")
    choices: list[CompletionChoice] = []
    for raw in body["choices"]:
        if not isinstance(raw, dict):
            raise EngineProtocolError(endpoint, "completions: a choice is not an object")
        where = f"completions choice {raw.get('index')!r:.20}"
        if "token_ids" not in raw or raw["token_ids"] is None:
            raise EngineProtocolError(
                endpoint, f"{where}: no token_ids (engine too old for return_token_ids?)"
            )
        token_ids = _int_list(endpoint, where, raw["token_ids"])
        prompt_ids = raw.get("prompt_token_ids")
        choices.append(
            CompletionChoice(
                index=_int(endpoint, where, raw.get("index"), len(choices)),
                text=str(raw.get("text", "")),
                token_ids=token_ids,
                logprobs=_logprobs(endpoint, where, raw.get("logprobs"), len(token_ids))
                if want_logprobs
                else None,
                finish_reason=_finish_reason(endpoint, where, raw.get("finish_reason")),
                prompt_token_ids=None if prompt_ids is None else _int_list(endpoint, where, prompt_ids),
            )
        )
    raw_usage = body.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    return Completion(
        id=str(body.get("id", "")),
        model=str(body.get("model", "")),
        choices=tuple(sorted(choices, key=lambda c: c.index)),
        prompt_tokens=_int(endpoint, "completions usage", usage.get("prompt_tokens"), 0),
        completion_tokens=_int(endpoint, "completions usage", usage.get("completion_tokens"), 0),
    )


def completion_request(
    prompt: str | Sequence[int],
    *,
    max_tokens: int,
    temperature: float,
    n: int,
    logprobs: bool,
    seed: int | None,
    model: str | None,
    stop_token_ids: Sequence[int] | None,
    ignore_eos: bool,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON body for vLLM's /v1/completions (vLLM 0.32 fields `return_token_ids`, `ignore_eos`)."""
    body: dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "n": n,
        "return_token_ids": True,
    }
    if logprobs:
        body["logprobs"] = 0  # the sampled token's logprob only, no top-k alternatives
    if seed is not None:
        body["seed"] = seed
    if model is not None:
        body["model"] = model
    if stop_token_ids:
        body["stop_token_ids"] = list(stop_token_ids)
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return body
