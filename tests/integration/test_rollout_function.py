"""spec.rollout.function against the stand-in engine (a real process): a multi-call function
whose tool output is masked from the loss, per-sample and per-group calls, and functions that
raise, return malformed samples or hang, each reported with the prompt and the function's name
up to the failure budget."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from rollout_executor.engine_client import EngineClient
from rollout_executor.failures import FailureBudgetExceeded
from rollout_executor.rewards import RewardError
from rollout_executor.rollout_api import PromptRow, RolloutSample

from tests.integration import test_executor as base
from tests.integration.test_executor import N_PROMPTS, N_SAMPLES, StandIn, assert_complete, config

dataset = base.dataset  # the fixtures, shared
make_executor = base.make_executor
HERE = "tests.integration.test_rollout_function"
TOOL = [7, 7, 7]


async def two_turns(client: EngineClient, row: PromptRow, tag: str = "x") -> RolloutSample:
    """Generate, append a 'tool result' (masked), generate again from the whole context."""
    first = await client.generate(row.text, max_tokens=3, stop=["\n"])
    ctx = [*first.prompt_token_ids, *first.token_ids, *TOOL]
    second = await client.generate(ctx, max_tokens=2)
    resp = [*first.token_ids, *TOOL, *second.token_ids]
    return RolloutSample(
        prompt_token_ids=first.prompt_token_ids, response_token_ids=resp,
        logprobs=[*first.logprobs, 0.0, 0.0, 0.0, *second.logprobs],
        loss_mask=[1] * len(first.token_ids) + [0] * len(TOOL) + [1] * len(second.token_ids),
        reward=float(row.index), metadata={"turns": 2, "tag": tag, "prompt": row.index},
    )


async def per_group(client: EngineClient, row: PromptRow) -> list[RolloutSample]:
    outs = await asyncio.gather(*(client.generate(row.text) for _ in range(row.n)))
    return [RolloutSample(prompt_token_ids=c.prompt_token_ids, response_token_ids=c.token_ids, logprobs=c.logprobs,
                          response=c.text, metadata={"i": i}) for i, c in enumerate(outs)]


async def bad_on_sample_1(client: EngineClient, row: PromptRow, how: str) -> RolloutSample:
    c = await client.generate(row.text)
    if row.key.sample == 1:
        if how == "raise":
            raise KeyError("no tool named calc")
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "mask":
            return RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs, loss_mask=[1])
    return RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs, reward=1.0)


@pytest.fixture
def standin(tmp_path: Path):
    s = StandIn(tmp_path, delay=0.05)
    yield s
    s.kill()


async def test_multi_call_function_masks_tool_output_and_carries_metadata(dataset: Path, tmp_path: Path, standin: StandIn,
                                                                          make_executor) -> None:
    cfg = config(dataset, tmp_path, [standin.url], rollout_function=f"{HERE}:two_turns", rollout_function_args={"tag": "t"})
    ex = await make_executor(cfg)
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    assert_complete(batch)
    assert ex.stats()["completed_requests"] == 2 * N_PROMPTS * N_SAMPLES, "two engine calls per sample, all through the generator"
    for i in range(len(batch)):
        p, r = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
        assert r == 3 + len(TOOL) + 2
        assert batch.tokens[i, p + 3 : p + 6].tolist() == TOOL
        assert batch.response_mask[i, p : p + r].tolist() == [1, 1, 1, 0, 0, 0, 1, 1]
        assert batch.response_mask[i, :p].sum() == 0
    md = batch.meta["sample_metadata"]
    assert [m["prompt"] for m in md] == batch.prompt_indices.tolist() and {m["tag"] for m in md} == {"t"}
    assert batch.rewards.tolist() == batch.prompt_indices.astype(np.float32).tolist(), "the function's own reward"
    assert "token_weight_versions" not in batch.arrays, "one version per sample: the optional array stays out"


async def test_per_group_function_is_called_once_per_prompt(dataset: Path, tmp_path: Path, standin: StandIn, make_executor) -> None:
    (tmp_path / "config.json").write_text('{"vocab_size": 1000}')
    cfg = config(dataset, tmp_path, [standin.url], rollout_function=f"{HERE}:per_group", rollout_function_per_group=True)
    ex = await make_executor(cfg)
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    assert_complete(batch)
    assert [m["i"] for m in batch.meta["sample_metadata"]] == batch.sample_indices.tolist()
    assert len(set(batch.rewards.tolist())) > 1, "samples without a reward were scored by spec.rollout.reward"


@pytest.mark.parametrize(("how", "reason", "what"), [("raise", "error", "raised KeyError: 'no tool named calc'"),
                                                     ("hang", "timeout", "timed out after 1s"),
                                                     ("mask", "malformed", "returned a malformed sample: loss_mask of 1 for 8 response tokens")])
async def test_a_failing_function_is_reported_with_prompt_and_name(dataset: Path, tmp_path: Path, standin: StandIn, make_executor,
                                                                   how: str, reason: str, what: str) -> None:
    cfg = config(dataset, tmp_path, [standin.url], rollout_function=f"{HERE}:bad_on_sample_1", rollout_function_args={"how": how},
                 rollout_function_timeout_seconds=1.0)
    ex = await make_executor(cfg)
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    failed = batch.meta["failed_samples"]
    assert sorted((f["group"], f["sample"]) for f in failed) == [(g, 1) for g in range(N_PROMPTS)]
    prompt_of = dict(zip(batch.group_indices.tolist(), batch.prompt_indices.tolist(), strict=True))
    for f in failed:
        assert f["reason"] == reason and f["source"] == "rollout" and f["dropped"]
        assert f["error"] == f"rollout function {HERE}:bad_on_sample_1 {what} for rollout 0 group {f['group']} sample 1 (prompt {prompt_of[f['group']]})"
    assert sorted(zip(batch.group_indices.tolist(), batch.sample_indices.tolist(), strict=True)) == [
        (g, s) for g in range(N_PROMPTS) for s in range(N_SAMPLES) if s != 1]
    assert ex.stats()["failed_samples"] == {f"rollout/{reason}": N_PROMPTS}
    # past the budget, the rollout fails with the cause
    ex2 = await make_executor(config(dataset, tmp_path, [standin.url], rollout_function=f"{HERE}:bad_on_sample_1",
                                     rollout_function_args={"how": "raise"}, failure_budget=0.1))
    with pytest.raises(FailureBudgetExceeded, match=r"more than spec\.rollout\.failureBudget 0\.1 allows \(1\); first: rollout function"):
        await asyncio.wait_for(ex2.get_batch(0), timeout=120)


def test_a_function_that_cannot_be_imported_fails_at_start(dataset: Path, tmp_path: Path) -> None:
    cfg = config(dataset, tmp_path, ["http://127.0.0.1:9"], rollout_function="no_such_pkg_q.mod:rollout")
    with pytest.raises(RewardError, match=r"spec\.rollout\.function 'no_such_pkg_q\.mod:rollout': cannot import 'no_such_pkg_q\.mod': No module named 'no_such_pkg_q'"):
        base.RolloutExecutor(cfg)


async def test_chat_rows_are_rendered_with_the_chat_template_and_sent_as_token_ids(
        tiny_model_dir: Path, tmp_path: Path, standin: StandIn, make_executor) -> None:
    from transformers import AutoTokenizer

    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"what is {i}+{i}?"}],
             "label": str(2 * i)} for i in range(6)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(path, tiny_model_dir, [standin.url], dataset_format="chat", batch_size=2,
                 reward_function="rollout_executor.rewards:exact_match", reward_args={})
    ex = await make_executor(cfg)
    sent: list[object] = []
    complete = ex.generator.complete

    async def spy(key, prompt, sampling=None):
        sent.append(prompt)
        return await complete(key, prompt, sampling)

    ex.generator.complete = spy  # type: ignore[method-assign]
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    assert len(batch) == 2 * N_SAMPLES
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    want = {tuple(tok.apply_chat_template(r["messages"], tokenize=True, add_generation_prompt=True)["input_ids"])
            for r in (rows[i] for i in batch.prompt_indices.tolist())}
    assert {tuple(p) for p in sent} == want, "the engine got the chat template's token ids, not text"  # type: ignore[arg-type]
    text = tok.decode(next(iter(want)))
    assert "assistant: " in text and "be brief" in text


async def test_calculator_environment_masks_the_tool_output(tiny_model_dir: Path, tmp_path: Path, standin: StandIn,
                                                            make_executor) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"what is {i} + 3?", "expression": f"{i} + 3"}) + "\n" for i in range(8)))
    cfg = config(path, tiny_model_dir, [standin.url], rollout_function="rollout_executor.envs.calculator:rollout",
                 rollout_function_args={"call_tokens": 900, "call_max_tokens": 4, "answer_max_tokens": 5})
    ex = await make_executor(cfg)
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    assert_complete(batch)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    called = 0
    for i, md in enumerate(batch.meta["sample_metadata"]):
        p, r = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
        mask = batch.response_mask[i, p : p + r].tolist()
        if not md["called"]:
            assert mask == [1] * 4 and batch.rewards[i] == 0.0
            continue
        called += 1
        n_tool = md["tool_tokens"]
        assert mask == [1] * 4 + [0] * n_tool + [1] * 5, "the tool's output is in the context, not in the loss"
        tool_text = tok.decode(batch.tokens[i, p + 4 : p + 4 + n_tool].tolist())
        assert tool_text == f" = {md['result']}\n" and md["result"] == str(batch.prompt_indices[i] + 3)
        assert (batch.logprobs[i, p + 4 : p + 4 + n_tool] == 0).all() and batch.rewards[i] >= 1.0
    assert called > 0
