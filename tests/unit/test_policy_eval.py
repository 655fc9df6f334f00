"""Evaluation of the policy (spec.rollout.eval): pass@1 and mean reward, when evals run, the
eval fleet re-pinned per eval point, status.lastEval through the verb table, the summary and curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rljob_cli import report
from rljob_client.controller_client import LocalControllerClient
from rljob_client.trainer.evaluation import EvalPoint, PolicyEvaluator, eval_due
from rljob_client.trainer.loop import StepRecord
from rollout_executor.config import ExecutorConfig
from rollout_executor.dataset import Prompt
from rollout_executor.evaluation import EvalTask, eval_metrics, eval_on_policy_fleet, record_request
from rollout_executor.generation import Completion, SamplingParams
from rollout_executor.rewards import exact_match, success_threshold
from rollout_executor.samples import SampleKey

from controller_runtime.api.control import RecordEvalRequest
from controller_runtime.api.spec import PolicyEvalSpec, RLJobManifest
from controller_runtime.api.status import RLJobStatus
from controller_runtime.api.verbs import VERBS
from tests.unit.crd_cases import load_manifest
from tests.unit.test_controller import EVAL, bring_up, harness

# -- pass@1 and the mean -----------------------------------------------------------------------


def test_pass_at_1_is_the_per_prompt_pass_fraction_averaged_and_the_mean_is_over_samples() -> None:
    m = eval_metrics([[1.0, 0.0], [1.0, 1.0], [0.2, 0.6]], threshold=1.0)
    assert m.pass_at_1 == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert m.mean_reward == pytest.approx(3.8 / 6)
    assert (m.samples, m.prompts) == (6, 3)


def test_a_reward_exactly_at_the_threshold_passes() -> None:
    assert eval_metrics([[0.5, 0.49]], threshold=0.5).pass_at_1 == 0.5


def test_no_samples_scores_nothing_rather_than_a_number_to_trust() -> None:
    m = eval_metrics([], threshold=1.0)
    assert (m.mean_reward, m.pass_at_1, m.samples) == (0.0, 0.0, 0)
    assert eval_metrics([[], [1.0]], threshold=1.0).pass_at_1 == 1.0  # a prompt without samples counts for nothing


def test_success_thresholds_of_the_built_in_rewards() -> None:
    for name in ("exact_match", "regex_match", "math_answer"):
        assert success_threshold(f"rollout_executor.rewards:{name}") == 1.0  # a correct answer
    assert success_threshold("rollout_executor.rewards:token_set_fraction") == 0.5  # half the tokens in the set
    assert success_threshold("my.rewards:score") == 1.0
    assert success_threshold("rollout_executor.rewards:token_set_fraction", 0.9) == 0.9


# -- the spec -----------------------------------------------------------------------------------


def test_eval_spec_defaults_and_the_executor_reads_it() -> None:
    manifest = load_manifest()
    manifest["spec"]["rollout"]["eval"] = {"everySteps": 5, "dataset": "/data/eval.jsonl", "maxTokens": 32}
    spec = RLJobManifest.model_validate(manifest).spec
    ev = spec.rollout.eval
    assert ev is not None and (ev.samples_per_prompt, ev.temperature, ev.max_prompts) == (1, 0.0, 64)
    cfg = ExecutorConfig.from_spec("j", spec)
    assert (cfg.eval_every_steps, cfg.eval_dataset_path, cfg.eval_max_tokens, cfg.eval_prompts) == (
        5, "/data/eval.jsonl", 32, 64)
    assert ExecutorConfig.from_spec("j", RLJobManifest.model_validate(load_manifest()).spec).eval_every_steps == 0


def test_every_steps_is_required_and_positive() -> None:
    with pytest.raises(ValueError, match=r"every_steps|everySteps"):
        PolicyEvalSpec.model_validate({})
    with pytest.raises(ValueError):
        PolicyEvalSpec(every_steps=0)


# -- when the trainer evaluates -----------------------------------------------------------------


def test_eval_points_are_every_n_steps_and_the_last_step() -> None:
    assert [s for s in range(0, 6) if eval_due(s, 2, 5)] == [2, 4, 5]
    assert not any(eval_due(s, 0, 5) for s in range(6))


async def test_evaluator_asks_the_executor_at_eval_points_with_the_step_weights() -> None:
    calls: list[tuple[int, int, str | None]] = []

    def evaluate(step: int, version: int, checkpoint: str | None) -> dict[str, Any]:
        calls.append((step, version, checkpoint))
        if step == 4:
            raise RuntimeError("engine gone")
        return {"skipped": False, "weight_version": str(version), "mean_reward": 0.25, "pass_at_1": 0.5, "n": 8,
                "fleet": "policy"}

    seen: list[EvalPoint] = []
    ev = PolicyEvaluator(2, 5, evaluate, checkpoint_for=lambda v: f"/w/v{v}", on_point=seen.append)
    for done in range(1, 6):
        await ev.after_update(done)
    assert calls == [(2, 2, "/w/v2"), (4, 4, "/w/v4"), (5, 5, "/w/v5")]
    assert [(p.step, p.skipped, p.pass_at_1) for p in ev.points] == [(2, False, 0.5), (4, True, None), (5, False, 0.5)]
    assert "RuntimeError: engine gone" in (ev.points[1].reason or "")  # a failed eval never stops training
    assert seen == ev.points


def test_evaluator_from_a_stream_without_eval_is_none() -> None:
    class Stream:
        eval_every_steps = 0

        def eval(self, *a: Any) -> dict[str, Any]:
            raise AssertionError("not called")

    assert PolicyEvaluator.from_stream(Stream(), 10) is None
    Stream.eval_every_steps = 3
    ev = PolicyEvaluator.from_stream(Stream(), 10)
    assert ev is not None and ev.every_steps == 3


# -- the executor's policy-fleet eval --------------------------------------------------------------


class EchoGenerator:
    """Answers each prompt with its label on even sample indices, garbage on odd ones."""

    def __init__(self) -> None:
        self.calls: list[tuple[SampleKey, SamplingParams]] = []

    async def complete(self, key: SampleKey, prompt: str, sampling: SamplingParams | None = None) -> Completion:
        assert sampling is not None
        self.calls.append((key, sampling))
        text = prompt.split("=")[1] if key.sample % 2 == 0 else "nope"
        return Completion(key, "http://e", 7, text, [1], [2], [-0.1], "stop")


async def test_policy_fleet_eval_scores_every_sample_and_reports_the_version() -> None:
    prompts = [Prompt(index=i, text=f"q{i}={i}", label=str(i), record={}) for i in range(3)]
    task = EvalTask(prompts, SamplingParams(max_tokens=4, temperature=1.0), 2, 1.0, exact_match,
                    "rollout_executor.rewards:exact_match", {}, None)
    gen = EchoGenerator()
    out = await eval_on_policy_fleet(6, gen, task)  # type: ignore[arg-type]
    assert sorted(k for k, _ in gen.calls) == [SampleKey(6, g, s) for g in range(3) for s in range(2)]
    assert all(s.max_tokens == 4 for _, s in gen.calls)
    assert (out["fleet"], out["weight_version"], out["n"], out["prompts"]) == ("policy", "7", 6, 3)
    assert out["pass_at_1"] == 0.5 and out["mean_reward"] == 0.5
    req = record_request(out)
    assert (req.step, req.weight_version, req.pass_at_1, req.samples) == (6, "7", 0.5, 6)


# -- the controller: re-pinning and status.lastEval ------------------------------------------------


async def test_an_eval_point_repins_the_eval_fleet_to_the_step_weights() -> None:
    h = harness(1, eval=EVAL)
    await bring_up(h)
    client = LocalControllerClient(h.ctrl)
    fleet = await client.eval_fleet("/ckpt/job/v4", "4")
    assert fleet.ok and (fleet.pinned_version, fleet.checkpoint) == ("4", "/ckpt/job/v4")
    evals = h.ctrl.fleet.evals()
    assert {(c.weight_version) for c in evals} == {"4"}
    assert all(h.engines(c.endpoint or "").checksums == {"w": "disk:/ckpt/job/v4"} for c in evals)
    again = await client.eval_fleet("/ckpt/job/v6", "6")  # the next eval point loads again
    assert again.ok and {c.weight_version for c in h.ctrl.fleet.evals()} == {"6"}
    assert (await client.eval_fleet()).pinned_version == "base"  # no body: the spec's checkpoint, as before


async def test_record_eval_is_status_last_eval_and_survives_a_restore() -> None:
    assert VERBS["record_eval"].writes_status and VERBS["record_eval"].method == "POST"
    h = harness(1)
    client = LocalControllerClient(h.ctrl)
    got = await client.record_eval(RecordEvalRequest(step=4, weight_version="4", reward=0.4, pass_at_1=0.25,
                                                      samples=16))
    assert got.step == 4 and got.time is not None
    await client.record_eval(RecordEvalRequest(step=2, reward=0.1, pass_at_1=0.0))  # a late retry of an older point
    wire = h.ctrl.status_patch()["lastEval"]
    assert (wire["step"], wire["passAt1"], wire["reward"], wire["fleet"]) == (4, 0.25, 0.4, "policy")
    status = RLJobStatus.model_validate(h.ctrl.status_patch())
    assert status.last_eval is not None and status.last_eval.pass_at_1 == 0.25
    assert h.new_controller(restore=status).status_patch()["lastEval"] == wire


def test_no_eval_yet_is_no_last_eval() -> None:
    assert harness(1).ctrl.status_patch()["lastEval"] is None


# -- local mode's summary and curve ----------------------------------------------------------------


def _record(step: int, reward: float) -> StepRecord:
    return StepRecord(step=step, weight_version=step + 1, reward_mean=reward, reward_std=0.1, loss=0.0, samples=8,
                      response_tokens=64)


def test_summary_lists_eval_points_and_the_curve_draws_them(tmp_path: Path) -> None:
    records = [_record(s, 0.1 * s) for s in range(4)]
    evals = [EvalPoint(2, "2", 0.2, 0.25, 8, "policy"), EvalPoint(4, None, None, None, skipped=True, reason="x"),
             EvalPoint(4, "4", 0.3, 0.5, 8, "policy")]
    summary = report.summarize(records, evals, job="j")
    assert [e["step"] for e in summary["evals"]] == [2, 4, 4]
    assert summary["last_eval"]["pass_at_1"] == 0.5
    assert report.summarize(records)["last_eval"] is None
    path = report.plot_rewards(tmp_path, records, "t", evals)
    assert path.stat().st_size > 1000


def test_the_executor_waits_for_engines_at_least_as_long_as_the_operator_lets_them_start() -> None:
    """An executor that gave up on engines before the operator did would end a job whose cells
    were still expected to come up (was a fixed 600 s against the default 1800 s deadline)."""
    manifest = load_manifest()
    manifest["spec"]["inference"].pop("healthCheck", None)  # the defaults: 1800 s, then 3 probes of 30 + 30 s
    default = ExecutorConfig.from_spec("j", RLJobManifest.model_validate(manifest).spec)
    assert default.no_engine_timeout_seconds == 1800 + 3 * (30 + 30)
    manifest["spec"]["inference"]["healthCheck"] = {"startupDeadlineSeconds": 60, "intervalSeconds": 2,
                                                    "timeoutSeconds": 1, "failureThreshold": 3}
    short = ExecutorConfig.from_spec("j", RLJobManifest.model_validate(manifest).spec)
    assert short.no_engine_timeout_seconds == 600.0  # the floor: a window or a backoff with every cell down
    manifest["spec"]["inference"]["healthCheck"]["startupDeadlineSeconds"] = 3600
    assert ExecutorConfig.from_spec("j", RLJobManifest.model_validate(manifest).spec).no_engine_timeout_seconds == 3609
