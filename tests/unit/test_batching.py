"""Samples to train batch: padding, masks, logprobs alignment, GRPO advantages, sharding, byte format."""

from __future__ import annotations

import numpy as np
import pytest
from rljob_client.wire.trainbatch import decode, encode_bytes
from rollout_executor.batching import build_batch, check_groups_complete, group_advantages
from rollout_executor.samples import Sample, SampleKey


def make(group: int, idx: int, reward: float, plen: int = 2, rlen: int = 3, version: int = 0) -> Sample:
    return Sample(
        key=SampleKey(0, group, idx),
        prompt_index=100 + group,
        prompt="p",
        label=None,
        prompt_token_ids=list(range(10, 10 + plen)),
        response_token_ids=list(range(50, 50 + rlen)),
        response_logprobs=[-0.5 - i for i in range(rlen)],
        response="r",
        finish_reason="length",
        weight_version=version,
        engine="e",
        reward=reward,
    )


def test_group_advantages_are_normalised_per_group() -> None:
    rewards = np.array([1.0, 0.0, 0.5, 0.5, 2.0, 4.0])
    groups = np.array([0, 0, 1, 1, 2, 2])
    adv = group_advantages(rewards, groups)
    assert adv[:2] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert adv[2:4] == pytest.approx([0.0, 0.0]), "equal rewards carry no signal"
    assert adv[4:] == pytest.approx([-1.0, 1.0], abs=1e-4)
    for g in range(3):
        assert adv[groups == g].mean() == pytest.approx(0.0, abs=1e-6)


def test_build_batch_pads_masks_and_aligns_logprobs() -> None:
    samples = [make(1, 0, 1.0, rlen=1), make(0, 1, 0.0, plen=3), make(0, 0, 1.0), make(1, 1, 0.0, rlen=4)]
    b = build_batch(samples, rollout_id=0, n_samples_per_prompt=2, pad_id=0)
    assert b.tokens.shape == (4, 6)
    assert list(b.group_indices) == [0, 0, 1, 1] and list(b.sample_indices) == [0, 1, 0, 1]
    row = 1  # group 0 sample 1: prompt 3 tokens, response 3 tokens
    assert list(b.tokens[row]) == [10, 11, 12, 50, 51, 52]
    assert list(b.response_mask[row]) == [0, 0, 0, 1, 1, 1]
    assert b.logprobs[row][3:] == pytest.approx([-0.5, -1.5, -2.5])
    assert (b.logprobs[b.response_mask == 0] == 0).all()
    assert list(b.tokens[2]) == [10, 11, 50, 0, 0, 0]
    assert list(b.response_lengths) == [3, 3, 1, 4]
    assert b.advantages == pytest.approx(group_advantages(b.rewards, b.group_indices))
    assert list(b.prompt_indices) == [100, 100, 101, 101]


def test_shards_are_disjoint_whole_groups_and_cover_the_batch() -> None:
    samples = [make(g, i, float(i)) for g in range(5) for i in range(3)]
    b = build_batch(samples, rollout_id=7, n_samples_per_prompt=3)
    shards = [b.shard(r, 3) for r in range(3)]
    seen = [(int(g), int(s)) for sh in shards for g, s in zip(sh.group_indices, sh.sample_indices, strict=True)]
    assert sorted(seen) == sorted((g, i) for g in range(5) for i in range(3))
    assert len(seen) == len(set(seen))
    for sh in shards:
        for g in np.unique(sh.group_indices):
            assert (sh.group_indices == g).sum() == 3, "a group is never split across ranks"
    with pytest.raises(ValueError):
        b.shard(3, 3)


def test_byte_format_round_trips_without_copy() -> None:
    b = build_batch([make(g, i, float(i)) for g in range(2) for i in range(2)], rollout_id=4, n_samples_per_prompt=2)
    buf = bytearray(encode_bytes(b.shard(1, 2)))
    back = decode(buf)
    assert back.rollout_id == 4 and back.rank == 1 and back.world_size == 2
    for name, arr in b.shard(1, 2).arrays.items():
        assert back.arrays[name].dtype == arr.dtype
        assert np.array_equal(back.arrays[name], arr)
    assert np.shares_memory(back.tokens, np.frombuffer(buf, dtype=np.uint8))
    with pytest.raises(ValueError, match="magic"):
        decode(b"XXXX" + bytes(40))


def test_check_groups_complete_reports_missing_and_duplicate() -> None:
    check_groups_complete([make(0, 0, 0), make(0, 1, 0)], 1, 2)
    with pytest.raises(ValueError, match="group 0 has samples"):
        check_groups_complete([make(0, 0, 0)], 1, 2)
    with pytest.raises(ValueError, match="duplicate"):
        check_groups_complete([make(0, 0, 0), make(0, 0, 0)], 1, 2)
