"""The executor's settings as plain, picklable data (they travel into the Ray actor).

Built from an RLJob manifest (`from_spec`) so the executor reads exactly what the user wrote
in `spec.rollout`; everything else (where engines are, where state goes) comes from the
command line of `python -m rollout_executor`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller_runtime.api.spec import HealthCheckSpec, RLJobSpec

ACTOR_NAMESPACE = "rljob"


def actor_name(job: str) -> str:
    """The named detached actor of a job (namespace `rljob`)."""
    return f"rljob-executor-{job}"


@dataclass(frozen=True)
class EngineSource:
    """Where the serving engines are found; exactly one way is used, first match wins.

    - `endpoints`: a fixed list of base URLs (tests, local mode before the controller exists);
    - `router_url`: one URL (a router) that spreads requests itself;
    - `controller_url`: the operator's controller API; `cells.servingEndpoints` is polled;
    - `engines_url`: the `<job>-engines` Service URL.
    """

    endpoints: tuple[str, ...] = ()
    router_url: str | None = None
    controller_url: str | None = None
    engines_url: str | None = None
    namespace: str = "default"
    token_path: str | None = None
    refresh_seconds: float = 2.0


@dataclass(frozen=True)
class ExecutorConfig:
    job: str
    dataset_path: str
    model: str
    dataset_format: str | None = None
    prompt_field: str = "prompt"
    messages_field: str = "messages"  # dataset_format chat
    label_field: str | None = "label"
    shuffle: bool = True
    seed: int = 0
    n_samples_per_prompt: int = 8
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    reward_function: str = "rollout_executor.rewards:exact_match"
    reward_args: dict[str, Any] = field(default_factory=dict)
    reward_workers: int = 2
    reward_timeout_seconds: float = 60.0
    reward_on_error: str = "score"  # or "drop": the failed sample leaves its group
    reward_error_value: float = 0.0
    rollout_function: str | None = None  # None: single-turn generation (rollout_executor.rollout_fn:single_turn)
    rollout_function_args: dict[str, Any] = field(default_factory=dict)
    rollout_function_per_group: bool = False
    rollout_function_timeout_seconds: float = 600.0
    failure_budget: float = 0.25
    batch_size: int = 8
    max_staleness: int = 1
    concurrency: int = 16
    on_weight_update: str = "drain"
    tokenizer_path: str | None = None
    state_dir: str | None = None
    engines: EngineSource = field(default_factory=EngineSource)
    request_timeout_seconds: float = 300.0
    max_attempts_per_sample: int = 20
    no_engine_timeout_seconds: float = 600.0
    eval_dataset_path: str | None = None
    eval_prompts: int = 16
    eval_max_tokens: int | None = None
    eval_every_steps: int = 0  # spec.rollout.eval.everySteps; 0: the policy is not evaluated
    eval_samples_per_prompt: int = 1
    eval_temperature: float = 0.0
    eval_success_threshold: float | None = None  # None: the reward's own (rewards.success_threshold)
    data_host: str = "127.0.0.1"
    data_port: int = 0
    data_advertise_host: str | None = None

    @classmethod
    def from_spec(cls, job: str, spec: RLJobSpec, **overrides: Any) -> ExecutorConfig:
        r = spec.executor
        model = spec.model.path or "/models"
        base: dict[str, Any] = dict(
            job=job,
            dataset_path=r.dataset.path,
            dataset_format=r.dataset.format,
            prompt_field=r.dataset.prompt_field,
            messages_field=r.dataset.messages_field,
            label_field=r.dataset.label_field,
            shuffle=r.dataset.shuffle,
            seed=r.dataset.seed,
            n_samples_per_prompt=r.sampling.n_samples_per_prompt,
            max_tokens=r.sampling.max_tokens,
            temperature=r.sampling.temperature,
            top_p=r.sampling.top_p,
            reward_function=r.reward.function,
            reward_args=dict(r.reward.args),
            reward_workers=r.reward.workers,
            reward_timeout_seconds=r.reward.timeout_seconds,
            reward_on_error=str(r.reward.on_error),
            reward_error_value=r.reward.error_reward,
            rollout_function=r.function,
            rollout_function_args=dict(r.function_args),
            rollout_function_per_group=r.function_per_group,
            rollout_function_timeout_seconds=r.function_timeout_seconds,
            failure_budget=r.failure_budget,
            batch_size=r.batch_size,
            max_staleness=r.max_staleness,
            concurrency=r.concurrency,
            on_weight_update=str(r.on_weight_update),
            model=model,
            tokenizer_path=spec.model.tokenizer or spec.model.path,
            no_engine_timeout_seconds=no_engine_timeout_seconds(spec.inference.health_check),
        )
        if r.eval is not None:
            base.update(eval_every_steps=r.eval.every_steps, eval_dataset_path=r.eval.dataset,
                        eval_prompts=r.eval.max_prompts, eval_samples_per_prompt=r.eval.samples_per_prompt,
                        eval_max_tokens=r.eval.max_tokens, eval_temperature=r.eval.temperature,
                        eval_success_threshold=r.eval.success_threshold)
        if spec.inference.router is not None and "engines" not in overrides:
            base["engines"] = EngineSource(router_url=spec.inference.router.url)
        base.update(overrides)
        return cls(**base)


NO_ENGINE_TIMEOUT_FLOOR_S = 600.0  # a weight window or a restart backoff with every cell down


def no_engine_timeout_seconds(health: HealthCheckSpec) -> float:
    """How long rollouts wait for a serving engine before the executor fails.

    Never shorter than the operator takes to give up on a starting cell (its startup deadline,
    then failureThreshold probes that time out): an executor that failed first would end a job
    whose engines were still expected to come up (a large model's load can take the default
    30 minutes). When the operator does give up and the restart budget is spent, the job fails
    and the executor goes with it.
    """
    operator_gives_up = health.startup_deadline_seconds + health.failure_threshold * (
        health.interval_seconds + health.timeout_seconds)
    return max(NO_ENGINE_TIMEOUT_FLOOR_S, operator_gives_up)
