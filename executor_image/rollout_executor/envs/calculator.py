"""A two-turn calculator environment: the model calls the tool, the tool's output joins the
context (masked from the loss), the model answers.

`spec.rollout.function: rollout_executor.envs.calculator:rollout`. Rows carry an arithmetic
`expression` (e.g. "12 + 7"). A random tiny model cannot write a tool-call syntax, so the
call here is one token: the turn starts with one of a fixed random set of `call_tokens` ids
(drawn like token_set_fraction's set, base rate call_tokens / vocab). A real model's
environment parses its call from the text instead; the plumbing is the same. Reward: 1.0
when the tool was called, plus `answer_weight` x the share of the result's tokens that the
answer repeats.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from rollout_executor.engine_client import EngineClient
from rollout_executor.rewards import token_set
from rollout_executor.rollout_api import PromptRow, RolloutSample

_OPS: dict[type, Callable[..., float]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The calculator tool: + - * / and parentheses on numbers, nothing else (no names, no calls)."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")

    try:
        value = ev(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def call_set(vocab_size: int, special_ids: frozenset[int], size: int, seed: int) -> frozenset[int]:
    return token_set(vocab_size, special_ids, size, seed)


def score(called: bool, result_ids: list[int], answer_ids: list[int], answer_weight: float) -> float:
    """1 for a call, plus answer_weight x the share of the result's tokens found in the answer."""
    if not called:
        return 0.0
    overlap = len(set(result_ids) & set(answer_ids)) / len(set(result_ids)) if result_ids else 0.0
    return 1.0 + answer_weight * overlap


async def rollout(client: EngineClient, row: PromptRow, call_tokens: int = 100, seed: int = 0, call_max_tokens: int = 4,
                  answer_max_tokens: int = 8, answer_weight: float = 0.5) -> RolloutSample:
    tok = client.tokenizer
    special = frozenset(int(i) for i in getattr(tok, "all_special_ids", []))
    calls = call_set(len(tok), special, call_tokens, seed)
    prompt = client.render(row.messages) if row.messages is not None else tok.encode(row.text)
    first = await client.generate(prompt, max_tokens=call_max_tokens)
    called = bool(first.token_ids) and first.token_ids[0] in calls
    response = list(first.token_ids)
    mask = [1] * len(response)
    logprobs = list(first.logprobs)
    versions = [first.weight_version] * len(response)
    meta: dict[str, Any] = {"called": called}
    result_ids: list[int] = []
    answer_ids: list[int] = []
    if called:
        result = calculate(str(row.record.get("expression", "")))
        tool = tok.encode(f" = {result}\n", add_special_tokens=False)
        result_ids = tok.encode(result, add_special_tokens=False)
        second = await client.generate([*prompt, *response, *tool], max_tokens=answer_max_tokens)
        answer_ids = list(second.token_ids)
        response += [*tool, *answer_ids]
        mask += [0] * len(tool) + [1] * len(answer_ids)  # the tool's output is not the model's: not trained on
        logprobs += [0.0] * len(tool) + list(second.logprobs)
        versions += [second.weight_version] * (len(tool) + len(answer_ids))
        meta.update(result=result, tool_tokens=len(tool))
    return RolloutSample(
        prompt_token_ids=list(prompt), response_token_ids=response, logprobs=logprobs, loss_mask=mask,
        weight_versions=versions, reward=score(called, result_ids, answer_ids, answer_weight),
        response=tok.decode(response), metadata=meta, engine=first.engine,
    )
