"""Scored samples → one TrainBatch: padded token ids, response mask, logprobs, advantages.

A rollout function's loss mask (tool output: 0) becomes the response mask; its per-token
weight versions, when any sample has them, the optional `token_weight_versions` array; its
samples' metadata the meta's `sample_metadata` (one per row). Both are absent otherwise, so
a single-turn batch is byte for byte what it always was.

Pure functions (numpy only) so they are tested without engines or Ray.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Any

import numpy as np
from rljob_client.wire.trainbatch import TrainBatch

from rollout_executor.samples import Sample

ADV_EPS = 1e-6


def group_advantages(rewards: np.ndarray, groups: np.ndarray, eps: float = ADV_EPS) -> np.ndarray:
    """GRPO: each reward minus its group's mean, divided by the group's std (ddof=0) + eps.

    A group whose rewards are all equal gets advantage 0 for every sample (no signal).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(rewards)
    for g in np.unique(groups):
        rows = groups == g
        r = rewards[rows]
        out[rows] = (r - r.mean()) / (r.std() + eps)
    return out.astype(np.float32)


def check_groups_complete(samples: list[Sample], n_groups: int, n_per_group: int,
                          dropped: Collection[tuple[int, int]] = ()) -> None:
    """Every group holds exactly samples 0..n-1 once, but for the (group, sample) pairs dropped
    after a failure; raises naming what is wrong."""
    seen: dict[int, set[int]] = defaultdict(set)
    for g, s_ in dropped:
        seen[g].add(s_)
    for s in samples:
        if s.key.sample in seen[s.key.group]:
            raise ValueError(f"duplicate sample {s.key}")
        seen[s.key.group].add(s.key.sample)
    want = set(range(n_per_group))
    for g in range(n_groups):
        if seen.get(g, set()) != want:
            raise ValueError(f"group {g} has samples {sorted(seen.get(g, set()))}, expected 0..{n_per_group - 1}")
    extra = set(seen) - set(range(n_groups))
    if extra:
        raise ValueError(f"unexpected groups {sorted(extra)}")


def build_batch(samples: list[Sample], rollout_id: int, n_samples_per_prompt: int, pad_id: int = 0) -> TrainBatch:
    """Rows ordered by (group, sample). Rewards must be set."""
    ordered = sorted(samples, key=lambda s: (s.key.group, s.key.sample))
    n = len(ordered)
    if any(s.reward is None for s in ordered):
        raise ValueError("build_batch needs scored samples")
    plen = np.array([len(s.prompt_token_ids) for s in ordered], dtype=np.int32)
    rlen = np.array([len(s.response_token_ids) for s in ordered], dtype=np.int32)
    width = int((plen + rlen).max()) if n else 0
    tokens = np.full((n, width), pad_id, dtype=np.int32)
    mask = np.zeros((n, width), dtype=np.uint8)
    logprobs = np.zeros((n, width), dtype=np.float32)
    per_token = any(s.token_weight_versions is not None for s in ordered)
    token_versions = np.zeros((n, width), dtype=np.int64) if per_token else None
    for i, s in enumerate(ordered):
        p, r = plen[i], rlen[i]
        tokens[i, :p] = s.prompt_token_ids
        tokens[i, p : p + r] = s.response_token_ids
        mask[i, p : p + r] = 1 if s.loss_mask is None else s.loss_mask
        logprobs[i, p : p + r] = s.response_logprobs
        if token_versions is not None:
            token_versions[i, p : p + r] = s.weight_version if s.token_weight_versions is None else s.token_weight_versions
    rewards = np.array([s.reward for s in ordered], dtype=np.float32)
    groups = np.array([s.key.group for s in ordered], dtype=np.int32)
    arrays: dict[str, np.ndarray] = {
        "tokens": tokens,
        "response_mask": mask,
        "logprobs": logprobs,
        "prompt_lengths": plen,
        "response_lengths": rlen,
        "rewards": rewards,
        "advantages": group_advantages(rewards, groups),
        "weight_versions": np.array([s.weight_version for s in ordered], dtype=np.int64),
        "prompt_indices": np.array([s.prompt_index for s in ordered], dtype=np.int64),
        "group_indices": groups,
        "sample_indices": np.array([s.key.sample for s in ordered], dtype=np.int32),
    }
    if token_versions is not None:
        arrays["token_weight_versions"] = token_versions
    meta: dict[str, Any] = {"mean_reward": float(rewards.mean()) if n else 0.0}
    if any(s.metadata for s in ordered):
        meta["sample_metadata"] = [s.metadata for s in ordered]
    return TrainBatch(
        arrays=arrays,
        rollout_id=rollout_id,
        n_samples_per_prompt=n_samples_per_prompt,
        pad_id=pad_id,
        meta=meta,
    )
