"""VLLMClient against a real vLLM 0.32 CPU server (the session's shared `vllm_server`).

Every test leaves the shared server as it found it: resumed, awake, original weights and
weight version. The error-mapping tests at the end need no engine: they talk to a port
nothing listens on and to small raw socket servers written here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from controller_runtime.api.spec import MemoryTag, PauseMode
from controller_runtime.clients import Completion, VLLMClient
from controller_runtime.errors import (
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
)
from tests.fixtures.vllm_server import VLLMServer, free_port

# A request held by a paused/sleeping engine must still be pending after this long; the engine
# answers an unpaused tiny-model request in milliseconds, so this bounds a wait, not a race.
HELD_WAIT_S = 1.5
REQUEST_TIMEOUT_S = 120.0
GREEDY_TOKENS = 8


@pytest_asyncio.fixture(loop_scope="function")  # same loop as the test that uses it
async def vllm(vllm_server: VLLMServer) -> AsyncIterator[VLLMClient]:
    client = VLLMClient(vllm_server.endpoint, timeout=REQUEST_TIMEOUT_S)
    try:
        yield client
    finally:
        await client.close()


async def greedy(client: VLLMClient, prompt: list[int], n_tokens: int = GREEDY_TOKENS) -> tuple[int, ...]:
    reply = await client.completions(prompt, max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
    return reply.choices[0].token_ids


async def poll_until(check: Callable[[], Awaitable[bool]], deadline_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"condition not met within {deadline_s}s")
        await asyncio.sleep(0.05)


pytestmark_vllm = pytest.mark.vllm  # engine tests; the error-mapping tests below need none


@pytestmark_vllm
async def test_health_answers_on_a_serving_engine(vllm: VLLMClient) -> None:
    await vllm.health()


@pytestmark_vllm
async def test_completion_returns_token_ids_and_logprobs(vllm: VLLMClient) -> None:
    reply = await vllm.completions([5, 6, 7, 8], max_tokens=6, temperature=1.0, n=2, seed=11, ignore_eos=True)
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert len(choice.token_ids) == 6
        assert all(0 <= t < 1000 for t in choice.token_ids)
        assert choice.logprobs is not None and len(choice.logprobs) == 6
        assert all(lp <= 0.0 for lp in choice.logprobs)
        assert choice.prompt_token_ids == (5, 6, 7, 8)
        assert choice.finish_reason == "length"
    assert reply.completion_tokens == 12
    # greedy decoding is a function of the weights alone
    assert await greedy(vllm, [5, 6, 7, 8]) == await greedy(vllm, [5, 6, 7, 8])


@pytestmark_vllm
async def test_text_prompt_is_tokenised_by_the_server(vllm: VLLMClient) -> None:
    reply = await vllm.completions("The controller", max_tokens=3, temperature=0.0, ignore_eos=True)
    assert reply.prompt_tokens > 0 and len(reply.choices[0].token_ids) == 3


@pytestmark_vllm
async def test_pause_holds_a_request_until_resume(vllm: VLLMClient) -> None:
    expected = await greedy(vllm, [9, 10, 11])
    await vllm.pause(PauseMode.wait)
    try:
        assert await vllm.is_paused() is True
        held = asyncio.create_task(greedy(vllm, [9, 10, 11]))
        done, _ = await asyncio.wait({held}, timeout=HELD_WAIT_S)
        assert not done, "a request completed while the engine was paused"
    finally:
        await vllm.resume()
    assert await vllm.is_paused() is False
    assert await asyncio.wait_for(held, REQUEST_TIMEOUT_S) == expected


@pytestmark_vllm
async def test_abort_all_ends_a_request_held_by_pause_keep(vllm: VLLMClient) -> None:
    await vllm.pause(PauseMode.keep)
    try:
        held: asyncio.Task[Completion] = asyncio.create_task(
            vllm.completions([3, 4], max_tokens=32, temperature=0.0, ignore_eos=True)
        )
        aborted: list[int] = []

        async def aborted_one() -> bool:  # the request reaches the engine asynchronously
            aborted.append(await vllm.abort_requests())
            return aborted[-1] >= 1

        await poll_until(aborted_one)
    finally:
        await vllm.resume()
    reply = await asyncio.wait_for(held, REQUEST_TIMEOUT_S)
    assert reply.choices[0].finish_reason == "abort"
    assert len(reply.choices[0].token_ids) < 32


@pytestmark_vllm
async def test_sleep_on_cpu_holds_requests_and_wake_up_releases_them(vllm: VLLMClient) -> None:
    """On the CPU build sleep frees no memory; what it does do: report sleeping, say so in
    the sleep-state gauge, and hold new requests until woken. Waking only `weights` leaves
    the engine asleep (the KV cache is still "offloaded"); waking everything completes it."""
    expected = await greedy(vllm, [12, 13])
    await vllm.release_memory([MemoryTag.weights, MemoryTag.kv_cache])  # → sleep level 1
    try:
        assert await vllm.is_sleeping() is True
        gauges = await vllm.metrics()
        assert gauges['vllm:engine_sleep_state{sleep_state="weights_offloaded"}'] == 1.0
        assert gauges['vllm:engine_sleep_state{sleep_state="awake"}'] == 0.0
        held = asyncio.create_task(greedy(vllm, [12, 13]))
        done, _ = await asyncio.wait({held}, timeout=HELD_WAIT_S)
        assert not done, "a request completed while the engine slept"
        assert await vllm.wake_up(["weights"]) is False
        assert await vllm.is_sleeping() is True
    finally:
        await vllm.resume_memory([MemoryTag.weights, MemoryTag.kv_cache])
    assert await vllm.is_sleeping() is False
    assert (await vllm.metrics())['vllm:engine_sleep_state{sleep_state="awake"}'] == 1.0
    assert await asyncio.wait_for(held, REQUEST_TIMEOUT_S) == expected


def reference_greedy(model_dir: Path, prompt: list[int], n_tokens: int) -> tuple[tuple[int, ...], float]:
    """Greedy tokens computed in-process with transformers (float32 over the saved weights),
    and the smallest top-1/top-2 logit gap along the way."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = list(prompt)
    margin = float("inf")
    with torch.no_grad():
        for _ in range(n_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return tuple(ids[len(prompt) :]), margin


def pick_clear_prompt(
    model_dir: Path, candidates: list[list[int]], min_margin: float
) -> tuple[list[int], tuple[int, ...]]:
    """The first candidate prompt whose greedy path has no near-tie between the top two logits:
    bf16 kernels and float32 torch then agree on every argmax, so the comparison can be exact."""
    for prompt in candidates:
        tokens, margin = reference_greedy(model_dir, prompt, GREEDY_TOKENS)
        if margin >= min_margin:
            return prompt, tokens
    raise AssertionError("no candidate prompt has a clear greedy path; widen the candidates")


@pytestmark_vllm
async def test_reload_weights_serves_the_new_models_greedy_tokens(
    vllm: VLLMClient, tiny_model_dir: Path, tiny_model_dir_alt: Path
) -> None:
    candidates = [[1, 20 + 7 * i, 300 + 11 * i, 40 + i] for i in range(40)]
    prompt, alt_expected = await asyncio.to_thread(pick_clear_prompt, tiny_model_dir_alt, candidates, 0.02)
    base_tokens = await greedy(vllm, prompt)
    assert base_tokens != alt_expected, "both seeds give the same greedy path: the check would prove nothing"
    base_sums = await vllm.weight_checksums()
    assert base_sums
    try:
        await vllm.reload_weights(str(tiny_model_dir_alt))
        assert await greedy(vllm, prompt) == alt_expected
        alt_sums = await vllm.weight_checksums()
        assert alt_sums.keys() == base_sums.keys() and alt_sums != base_sums
    finally:
        await vllm.reload_weights(str(tiny_model_dir))
    assert await greedy(vllm, prompt) == base_tokens
    assert await vllm.weight_checksums() == base_sums


@pytestmark_vllm
async def test_weight_version_round_trips(vllm: VLLMClient, tiny_model_dir: Path) -> None:
    original = await vllm.get_weight_version()
    try:
        await vllm.set_weight_version("rl-step-7")
        assert await vllm.get_weight_version() == "rl-step-7"
        assert (await vllm.weight_info())["weight_version"] == "rl-step-7"
        await vllm.update_weights_from_disk(str(tiny_model_dir), version="rl-step-8")
        assert await vllm.get_weight_version() == "rl-step-8"
    finally:
        await vllm.set_weight_version(original if original is not None else "")
    assert await vllm.get_weight_version() == (original if original is not None else "")


@pytestmark_vllm
async def test_metrics_scrape_has_the_engine_gauges(vllm: VLLMClient) -> None:
    await greedy(vllm, [5, 6], n_tokens=2)
    gauges = await vllm.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in gauges
    assert gauges['vllm:engine_sleep_state{sleep_state="awake"}'] == 1.0
    assert gauges["vllm:num_requests_running"] == 0.0  # nothing in flight between requests
    assert gauges.get("vllm:generation_tokens_total", gauges.get("vllm:generation_tokens", 0.0)) >= 2.0


@pytestmark_vllm
async def test_flush_cache_on_an_idle_engine_succeeds(vllm: VLLMClient) -> None:
    await greedy(vllm, [7, 7, 7], n_tokens=2)
    await vllm.flush_cache()
    assert await vllm.reset_prefix_cache() is True


@pytestmark_vllm
async def test_a_rejected_parameter_is_an_http_error(vllm: VLLMClient) -> None:
    with pytest.raises(EngineHTTPError) as err:
        await vllm.sleep(level=7)  # the route accepts 0..2
    assert err.value.status in (400, 422)
    assert await vllm.is_sleeping() is False


# -- failures that need no engine ---------------------------------------------------------


async def test_nothing_listening_is_engine_unavailable() -> None:
    client = VLLMClient(f"http://127.0.0.1:{free_port()}", timeout=30.0)
    try:
        # a 30 s budget: refusal must be reported as such, not waited out as a timeout
        with pytest.raises(EngineUnavailable):
            await client.health()
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def raw_server(answer: bytes | None) -> AsyncIterator[str]:
    """A TCP server that reads the request head and answers `answer` (None: never answers)."""
    never = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            if answer is None:
                await never.wait()
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        never.set()
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_answers_is_engine_timeout() -> None:
    async with raw_server(None) as endpoint:
        client = VLLMClient(endpoint, timeout=0.5)
        try:
            with pytest.raises(EngineTimeout):
                await client.is_paused()
        finally:
            await client.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\nnot json!",
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{"paused": true}',
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n{"is_paused": "yes!"}',
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    ],
    ids=["not-json", "wrong-field", "wrong-type", "not-http"],
)
async def test_a_server_answering_garbage_is_engine_protocol_error(answer: bytes) -> None:
    async with raw_server(answer) as endpoint:
        client = VLLMClient(endpoint, timeout=10.0)
        try:
            with pytest.raises(EngineProtocolError):
                await client.is_paused()
        finally:
            await client.close()


async def test_an_http_error_status_is_engine_http_error() -> None:
    answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndead"
    async with raw_server(answer) as endpoint:
        client = VLLMClient(endpoint, timeout=10.0)
        try:
            with pytest.raises(EngineHTTPError) as err:
                await client.health()
            assert err.value.status == 503 and err.value.body == "dead"
        finally:
            await client.close()


@pytestmark_vllm
async def test_logprobs_are_those_of_the_sampling_distribution(vllm: VLLMClient, tiny_model_dir: Path) -> None:
    """The trainer's off-policy ratio divides by the engine's logprob of each sampled token, so
    the engine must report log softmax(logits / T) (vLLM --logprobs-mode processed_logprobs),
    not the raw model logprob that vLLM reports by default."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt, temperature = [5, 6, 7, 8], 0.25
    reply = await vllm.completions(prompt, max_tokens=6, temperature=temperature, seed=3, ignore_eos=True)
    choice = reply.choices[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + list(choice.token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    sampled = torch.tensor(choice.token_ids)

    def at(t: float) -> torch.Tensor:
        return torch.log_softmax(logits / t, dim=-1).gather(-1, sampled[:, None])[:, 0]

    engine = torch.tensor(choice.logprobs)
    processed, raw = (engine - at(temperature)).abs().max(), (engine - at(1.0)).abs().max()
    assert processed < 0.1 and processed < raw / 4, f"engine {engine} T={temperature} {at(temperature)} raw {at(1.0)}"
