"""The shard side channel over real loopback HTTP: auth, errors, keep-alive, zero-copy decode."""

from __future__ import annotations

import asyncio
import http.client
import json

import numpy as np
import pytest
import pytest_asyncio
from rljob_client.wire.trainbatch import TrainBatch, decode
from rollout_executor.datachannel import DataChannel
from rollout_executor.metrics import ExecutorMetrics


def batch(rollout_id: int, rank: int, world: int) -> TrainBatch:
    n = 4
    arrays = {
        "tokens": np.arange(n * 5, dtype=np.int32).reshape(n, 5) + rollout_id,
        "rewards": np.linspace(0, 1, n, dtype=np.float32),
        "group_indices": np.arange(n, dtype=np.int32),
    }
    return TrainBatch(arrays=arrays, rollout_id=rollout_id, rank=rank, world_size=world)


async def source(rollout_id: int, rank: int, world: int) -> TrainBatch:
    if rollout_id == 99:
        raise RuntimeError("reward function m:f raised ValueError for rollout 99 group 0 sample 0")
    return batch(rollout_id, rank, world)


def fetch(port: int, path: str, token: str | None) -> list[tuple[int, bytes]]:
    """Two requests on one kept-alive connection (as RolloutStream does)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(2):
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        out.append((r.status, r.read()))
    conn.close()
    return out


@pytest_asyncio.fixture(loop_scope="function")
async def channel():
    ch = DataChannel(source, token="s3cret", host="127.0.0.1", port=0)
    await ch.start()
    yield ch
    await ch.stop()


async def test_serves_the_shard_with_the_right_token(channel: DataChannel) -> None:
    replies = await asyncio.to_thread(fetch, channel.port, "/v1/rollouts/7/shards/1?world_size=2", "s3cret")
    for status, body in replies:
        assert status == 200
        got = decode(bytearray(body))
        assert (got.rollout_id, got.rank, got.world_size) == (7, 1, 2)
        assert np.array_equal(got.tokens, batch(7, 1, 2).tokens)


@pytest.mark.parametrize(
    ("path", "token", "status", "needle"),
    [
        ("/v1/rollouts/7/shards/0", "wrong", 401, "bearer token"),
        ("/v1/rollouts/7/shards/0", None, 401, "bearer token"),
        ("/v1/rollouts/7/shards/2?world_size=2", "s3cret", 400, "not in a world of size 2"),
        ("/v1/rollouts/x/shards/0", "s3cret", 400, "integers"),
        ("/v1/elsewhere", "s3cret", 404, "no route"),
        ("/v1/rollouts/99/shards/0", "s3cret", 500, "reward function m:f raised ValueError"),
    ],
)
async def test_refuses_and_reports_errors(channel: DataChannel, path: str, token: str | None, status: int, needle: str) -> None:
    replies = await asyncio.to_thread(fetch, channel.port, path, token)
    for got_status, body in replies:
        assert got_status == status
        assert needle in json.loads(body)["error"]


async def test_metrics_are_served_without_a_token_beside_the_shards() -> None:
    metrics = ExecutorMetrics("team-a", "demo", 1, lambda: (2, 0))
    metrics.sample_scored()
    ch = DataChannel(source, token="s3cret", host="127.0.0.1", port=0, metrics=metrics.exposition)
    await ch.start()
    try:
        replies = await asyncio.to_thread(fetch, ch.port, "/metrics", None)
    finally:
        await ch.stop()
    for status, body in replies:
        assert status == 200
        assert b'rljob_executor_samples_generated_total{job="demo",namespace="team-a"} 1.0' in body
        assert b'rljob_executor_requests_in_flight{job="demo",namespace="team-a"} 2.0' in body
