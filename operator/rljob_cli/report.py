"""What `rljob run` leaves behind: `summary.json` and `reward_curve.png` in the output directory.

The summary is the record a person (or a test) checks to see that the run learned: per-step
rewards and weight versions, the mean reward of the first and last five steps, timings, and
how often engines had to be restarted; with spec.rollout.eval, the policy's eval points
(mean reward and pass@1 on the eval set), which the curve draws as a second line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rljob_client.trainer.evaluation import EvalPoint
from rljob_client.trainer.loop import StepRecord

SUMMARY = "summary.json"
CURVE = "reward_curve.png"
WINDOW = 5


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(records: Sequence[StepRecord], evals: Sequence[EvalPoint] = (), **extra: Any) -> dict[str, Any]:
    rewards = [r.reward_mean for r in records]
    scored = [e for e in evals if not e.skipped]
    first, last = mean(rewards[:WINDOW]), mean(rewards[-WINDOW:])
    return {
        "steps": len(records),
        "rewards": rewards,
        "weight_versions": [r.weight_version for r in records],
        "first5_mean_reward": first,
        "last5_mean_reward": last,
        "reward_gain": (last - first) if first is not None and last is not None else None,
        "timings": {
            "mean_step_seconds": mean([r.step_seconds for r in records]),
            "mean_rollout_seconds": mean([r.rollout_seconds for r in records]),
            "mean_train_seconds": mean([r.train_seconds for r in records]),
            "mean_sync_seconds": mean([r.sync_seconds for r in records]),
        },
        "per_step": [r.to_dict() for r in records],
        "evals": [e.to_dict() for e in evals],
        "last_eval": scored[-1].to_dict() if scored else None,
        **extra,
    }


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    path = out_dir / SUMMARY
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def plot_rewards(out_dir: Path, records: Sequence[StepRecord], title: str, evals: Sequence[EvalPoint] = ()) -> Path:
    """Mean training reward per step; eval points (if any) at the step count whose policy they scored."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = out_dir / CURVE
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = [r.step for r in records]
    means = [r.reward_mean for r in records]
    ax.plot(steps, means, marker="o", markersize=3, label="mean reward")
    lo = [m - r.reward_std for m, r in zip(means, records, strict=True)]
    hi = [m + r.reward_std for m, r in zip(means, records, strict=True)]
    ax.fill_between(steps, lo, hi, alpha=0.2, label="± std over samples")
    scored = [(e.step, e.reward, e.pass_at_1) for e in evals
              if not e.skipped and e.reward is not None and e.pass_at_1 is not None]
    if scored:
        ax.plot([s for s, _, _ in scored], [r for _, r, _ in scored], marker="s", markersize=5,
                label="eval: mean reward")
        ax.plot([s for s, _, _ in scored], [p for _, _, p in scored], marker="^", markersize=5, linestyle="--",
                label="eval: pass@1")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    if means and all(math.isfinite(m) for m in means):
        ax.set_ylim(min(0.0, min(lo)), max(1.0, max(hi)))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(".reward_curve.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return path
