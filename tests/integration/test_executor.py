"""RolloutExecutor against the session's real vLLM server (and a small stand-in engine it can kill).

The stand-in is the tests' one light engine (tests/engine_standin) in its own process, with
`--standin-delay`: it answers completions after a delay with made-up token ids, so a test can
kill it (SIGKILL) while requests are in flight, or keep requests in flight across a weight update.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from rollout_executor.batching import group_advantages
from rollout_executor.config import EngineSource, ExecutorConfig
from rollout_executor.executor import RolloutExecutor
from rollout_executor.failures import FailureBudgetExceeded
from rollout_executor.rewards import token_set
from rollout_executor.samples import RewardInput, VocabInfo

from controller_runtime.api.control import EvalFleetResponse

pytestmark = pytest.mark.vllm

N_PROMPTS = 4
N_SAMPLES = 4

STANDIN = Path(__file__).resolve().parents[1] / "engine_standin" / "rljob_engine_standin.py"


class StandIn:
    def __init__(self, tmp: Path, delay: float) -> None:
        from rollout_executor.rayhead import free_port

        self.port = free_port()
        self.log = tmp / f"standin-{self.port}.log"
        self._out = self.log.open("wb")
        argv = [sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(self.port), "--standin-delay", str(delay)]
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while "serving" not in self.log.read_text():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "stand-in engine did not start"
            time.sleep(0.1)

    def requests(self) -> int:
        return self.log.read_text().count("request ")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._out.close()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    s = StandIn(tmp_path, delay=0.5)
    yield s
    s.kill()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?", "label": str(2 * i)}) + "\n" for i in range(12)))
    return path


def config(dataset: Path, model_dir: Path, endpoints: list[str], **kw: object) -> ExecutorConfig:
    base = dict(
        job="t",
        dataset_path=str(dataset),
        model=str(model_dir),
        tokenizer_path=str(model_dir),
        n_samples_per_prompt=N_SAMPLES,
        batch_size=N_PROMPTS,
        max_tokens=8,
        temperature=1.0,
        reward_function="rollout_executor.rewards:token_set_fraction",
        reward_args={"size": 100, "seed": 0},
        engines=EngineSource(endpoints=tuple(endpoints)),
        concurrency=4,
        no_engine_timeout_seconds=60,
    )
    base.update(kw)
    return ExecutorConfig(**base)  # type: ignore[arg-type]


@pytest_asyncio.fixture(loop_scope="function")
async def make_executor() -> AsyncIterator:
    made: list[RolloutExecutor] = []

    async def make(cfg: ExecutorConfig, **kw: object) -> RolloutExecutor:
        ex = RolloutExecutor(cfg, **kw)  # type: ignore[arg-type]
        await ex.start()
        made.append(ex)
        return ex

    yield make
    for ex in made:
        await ex.close()


async def wait_for(cond, within_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def assert_complete(batch, n_groups: int = N_PROMPTS, n: int = N_SAMPLES) -> None:
    pairs = list(zip(batch.group_indices.tolist(), batch.sample_indices.tolist(), strict=True))
    assert sorted(pairs) == [(g, s) for g in range(n_groups) for s in range(n)], "every group exactly once per sample"


async def test_groups_complete_and_rewards_correct(vllm_server, dataset: Path, make_executor) -> None:
    ex = await make_executor(config(dataset, vllm_server.model_dir, [vllm_server.endpoint]))
    batch = await ex.get_batch(0)
    assert_complete(batch)
    vocab = VocabInfo.from_model_dir(str(vllm_server.model_dir))
    assert vocab is not None and vocab.special_ids
    chosen = token_set(vocab.vocab_size, vocab.special_ids, 100, 0)
    for i in range(len(batch)):
        p, r = batch.prompt_lengths[i], batch.response_lengths[i]
        ids = batch.tokens[i, p : p + r].tolist()
        assert r > 0 and batch.response_mask[i].sum() == r
        want = sum(t in chosen for t in ids) / len(ids)
        assert batch.rewards[i] == pytest.approx(want)
        assert (batch.logprobs[i, p : p + r] <= 0).all() and (batch.logprobs[i, p : p + r] < 0).any()
    assert batch.advantages == pytest.approx(group_advantages(batch.rewards, batch.group_indices))
    # one GRPO group shares its prompt
    for g in range(N_PROMPTS):
        rows = np.flatnonzero(batch.group_indices == g)
        assert len({tuple(batch.tokens[i, : batch.prompt_lengths[i]].tolist()) for i in rows}) == 1
    assert ex.stats()["completed_requests"] == N_PROMPTS * N_SAMPLES


async def test_staleness_bound_refuses_old_samples(vllm_server, dataset: Path, make_executor) -> None:
    ex = await make_executor(config(dataset, vllm_server.model_dir, [vllm_server.endpoint], max_staleness=1))
    ex.generate(0)
    ex.generate(1)
    await asyncio.gather(ex.rollouts[0].task, ex.rollouts[1].task)
    ex.set_weight_version(1)  # one behind: still fresh
    b0 = await ex.get_batch(0)
    assert set(b0.weight_versions.tolist()) == {0}
    assert ex.stats()["stale_dropped_samples"] == 0
    ex.set_weight_version(2)  # rollout 1's samples are now 2 versions old: refused, regenerated
    b1 = await ex.get_batch(1)
    assert_complete(b1)
    assert set(b1.weight_versions.tolist()) == {2}
    stats = ex.stats()
    assert stats["stale_dropped_samples"] == N_PROMPTS * N_SAMPLES
    assert stats["stale_dropped_groups"] == N_PROMPTS
    with pytest.raises(ValueError, match="backwards"):
        ex.set_weight_version(1)


async def test_killed_engine_mid_rollout_loses_no_sample(vllm_server, dataset: Path, standin: StandIn, make_executor) -> None:
    ex = await make_executor(config(dataset, vllm_server.model_dir, [standin.url, vllm_server.endpoint], batch_size=6))
    ex.generate(0)
    await wait_for(lambda: standin.requests() >= 3, what="requests on the stand-in")
    standin.kill()
    batch = await ex.get_batch(0)
    assert_complete(batch, n_groups=6)
    stats = ex.stats()
    assert stats["retried_requests"] >= 1, "the requests in flight on the killed engine were retried"
    assert stats["engines"][standin.url]["errors"] >= 1
    assert stats["completed_requests"] == 6 * N_SAMPLES
    samples = ex.rollouts[0].samples
    assert len(samples) == 6 * N_SAMPLES
    assert {s.engine for s in samples.values()} <= {standin.url, vllm_server.endpoint}


@pytest.mark.parametrize("mode", ["abort", "drain"])
async def test_weight_update_drains_or_aborts_in_flight(dataset: Path, tmp_path: Path, standin: StandIn, make_executor, mode: str) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"vocab_size": 1000}')
    ex = await make_executor(config(dataset, model_dir, [standin.url], on_weight_update=mode, max_staleness=0))
    ex.generate(0)
    await wait_for(lambda: ex.stats()["in_flight"] >= 2, what="requests in flight")
    window = await ex.begin_weight_update()
    assert window["mode"] == mode and window["in_flight"] >= 2
    assert ex.stats()["in_flight"] == 0
    done_before = len(ex.rollouts[0].samples)
    assert await ex.end_weight_update(1) == 1
    batch = await ex.get_batch(0)
    assert_complete(batch)
    assert set(batch.weight_versions.tolist()) == {1}, "maxStaleness 0: only samples of the new weights"
    stats = ex.stats()
    if mode == "abort":
        assert stats["aborted_retries"] == window["in_flight"]
        assert done_before < N_PROMPTS * N_SAMPLES
    else:
        assert stats["aborted_retries"] == 0
        # drained requests finished on the old weights (version 0) and, with maxStaleness 0, were refused
        assert stats["stale_dropped_samples"] >= window["in_flight"]


def failing_reward(sample: RewardInput) -> float:
    if sample.key.sample == 1:
        raise ZeroDivisionError("boom")
    return 0.5


def nan_reward(sample: RewardInput) -> float:
    return float("nan")


@pytest.mark.parametrize(("fn", "match"), [("failing_reward", "raised ZeroDivisionError: boom"), ("nan_reward", "returned nan")])
async def test_bad_reward_past_the_failure_budget_is_a_clear_error(dataset: Path, tmp_path: Path, standin: StandIn, make_executor, fn: str, match: str) -> None:
    cfg = config(dataset, tmp_path, [standin.url], reward_function=f"tests.integration.test_executor:{fn}", reward_args={},
                 failure_budget=0.0, reward_workers=1)
    ex = await make_executor(cfg)
    with pytest.raises(FailureBudgetExceeded, match=rf"spec\.rollout\.failureBudget 0 .*first: reward function tests\.integration\.test_executor:{fn} {match}.*rollout 0 group \d sample \d"):
        await asyncio.wait_for(ex.get_batch(0), timeout=60)


async def test_eval_runs_on_pinned_fleet_or_skips_with_reason(vllm_server, dataset: Path, make_executor) -> None:
    cfg = replace(config(dataset, vllm_server.model_dir, [vllm_server.endpoint]), eval_prompts=3)
    ex = await make_executor(cfg)
    assert (await ex.eval(0))["reason"] == "not_configured"

    async def unreachable() -> EvalFleetResponse:
        raise ConnectionError("operator down")

    async def pinned_wrong() -> EvalFleetResponse:
        return EvalFleetResponse(endpoints=[vllm_server.endpoint], pinned_version="7", ok=False, skip_reason="pin_violation")

    async def fleet() -> EvalFleetResponse:
        return EvalFleetResponse(endpoints=[vllm_server.endpoint], pinned_version="7", checkpoint="/ckpt", ok=True)

    for provider, reason in ((unreachable, "controller_unreachable"), (pinned_wrong, "pin_violation")):
        ex2 = await make_executor(cfg, eval_fleet_provider=provider)
        out = await ex2.eval(0)
        assert out["skipped"] and out["reason"] == reason
    ex3 = await make_executor(cfg, eval_fleet_provider=fleet)
    out = await ex3.eval(5)
    assert not out["skipped"] and out["n"] == 3 and out["weight_version"] == "7"
    assert out["mean_reward"] == pytest.approx(sum(out["rewards"]) / 3)


async def test_save_and_load_resume_the_dataset(vllm_server, dataset: Path, tmp_path: Path, make_executor) -> None:
    cfg = config(dataset, vllm_server.model_dir, [vllm_server.endpoint], state_dir=str(tmp_path / "state"), n_samples_per_prompt=1)
    reference = await make_executor(cfg)
    expected = [p.index for p in reference.dataset.take(N_PROMPTS * 3)][N_PROMPTS:]
    first = await make_executor(cfg)
    await first.get_batch(0)
    first.generate(1)  # started but not saved: redone after the restart
    first.set_weight_version(3)
    first.save(0)
    restarted = await make_executor(cfg)
    assert restarted.load() == 0
    assert restarted.versions.current == 3
    b1 = await restarted.get_batch(1)
    b2 = await restarted.get_batch(2)
    assert b1.prompt_indices.tolist() + b2.prompt_indices.tolist() == expected


def test_missing_dataset_fails_at_start_naming_the_field(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        textwrap.dedent(
            f"""
            apiVersion: rljob.io/v1alpha1
            kind: RLJob
            metadata: {{name: t}}
            spec:
              model: {{path: {tmp_path}}}
              inference: {{gpusPerEngine: 0}}
              rollout:
                dataset: {{path: {tmp_path}/absent.jsonl}}
            """
        )
    )
    base = [sys.executable, "-m", "rollout_executor", "--job", "t", "--endpoint", "http://127.0.0.1:9"]
    # as written by hand, and as the operator's Deployment runs it (no manifest, --dataset)
    for argv in (["--manifest", str(manifest)], ["--dataset", f"{tmp_path}/absent.jsonl"]):
        proc = subprocess.run([*base, *argv], capture_output=True, text=True, timeout=120, env={**os.environ, "RLJOB_MODEL_PATH": str(tmp_path)})
        assert proc.returncode == 2, proc.stderr
        assert "spec.rollout.dataset.path" in proc.stderr and "absent.jsonl" in proc.stderr
