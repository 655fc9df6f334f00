"""Pure parsing of engine replies: completions with token ids, Prometheus text, the factory."""

from __future__ import annotations

import inspect

import pytest

from controller_runtime.api.spec import Engine
from controller_runtime.clients import SGLangClient, VLLMClient, make_engine_client
from controller_runtime.clients.completions import completion_request, parse_completion
from controller_runtime.clients.prometheus import parse_prometheus
from controller_runtime.errors import EngineProtocolError
from controller_runtime.ports import EngineClient

EP = "http://127.0.0.1:1"


def _choice(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "index": 0,
        "text": "ab",
        "token_ids": [5, 9],
        "logprobs": {"token_logprobs": [-1.0, -2.5], "tokens": ["a", "b"]},
        "finish_reason": "length",
        "prompt_token_ids": [1, 2],
    }
    base.update(over)
    return base


def test_completion_keeps_token_ids_logprobs_and_orders_choices() -> None:
    body = {
        "id": "c",
        "model": "m",
        "choices": [_choice(index=1, token_ids=[7, 8]), _choice()],
        "usage": {"prompt_tokens": 2, "completion_tokens": 4},
    }
    c = parse_completion(EP, body, want_logprobs=True)
    assert [ch.index for ch in c.choices] == [0, 1]
    assert c.choices[0].token_ids == (5, 9) and c.choices[1].token_ids == (7, 8)
    assert c.choices[0].logprobs == (-1.0, -2.5)
    assert c.choices[0].prompt_token_ids == (1, 2)
    assert (c.prompt_tokens, c.completion_tokens) == (2, 4)


@pytest.mark.parametrize(
    "body",
    [
        "not a dict",
        {"choices": "x"},
        {"choices": [_choice(token_ids=None)]},
        {"choices": [_choice(token_ids=["a"])]},
        {"choices": [_choice(logprobs=None)]},
        {"choices": [_choice(logprobs={"token_logprobs": [-1.0]})]},
        {"choices": [_choice(index="first")]},
        {"choices": [_choice(finish_reason=3)]},
        {"choices": [_choice()], "usage": {"prompt_tokens": "many"}},
    ],
)
def test_completion_without_what_rl_needs_is_a_protocol_error(body: object) -> None:
    with pytest.raises(EngineProtocolError):
        parse_completion(EP, body, want_logprobs=True)


def test_completion_request_asks_for_token_ids_and_sampled_logprob_only() -> None:
    body = completion_request(
        [1, 2],
        max_tokens=4,
        temperature=0.0,
        n=2,
        logprobs=True,
        seed=3,
        model=None,
        stop_token_ids=None,
        ignore_eos=True,
        extra=None,
    )
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["prompt"] == [1, 2] and body["seed"] == 3 and body["ignore_eos"] is True
    assert "model" not in body


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/m"} 2.0
vllm:engine_sleep_state{engine="0",model_name="/m",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="/m",sleep_state="discard_all"} 0.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0"} 4.0
vllm:odd{engine="0",path="a}b"} 5.0
python_gc_objects_collected_total{generation="0"} 9.0
vllm:nan_gauge NaN
"""


def test_prometheus_folds_engine_labels_and_keeps_the_others() -> None:
    m = parse_prometheus(METRICS, prefix="vllm:")
    assert m["vllm:num_requests_running"] == 2.0
    assert m['vllm:engine_sleep_state{sleep_state="awake"}'] == 1.0
    assert m['vllm:engine_sleep_state{sleep_state="discard_all"}'] == 0.0
    assert m["vllm:e2e_request_latency_seconds_count"] == 4.0
    assert m['vllm:odd{path="a}b"}'] == 5.0
    assert not any(k.endswith("_bucket") or k.startswith("python_") or "nan" in k for k in m)


def test_factory_picks_the_client_for_the_engine() -> None:
    assert isinstance(make_engine_client(Engine.vllm, EP), VLLMClient)
    assert isinstance(make_engine_client("sglang", EP + "/"), SGLangClient)
    assert make_engine_client("sglang", EP + "/").endpoint == EP
    with pytest.raises(ValueError):
        make_engine_client("tgi", EP)


@pytest.mark.parametrize("cls", [VLLMClient, SGLangClient])
def test_each_client_has_every_engine_client_method(cls: type) -> None:
    wanted = {n for n, v in vars(EngineClient).items() if inspect.iscoroutinefunction(v)}
    assert wanted >= {"health", "pause", "update_weights_from_disk", "weight_checksums", "close"}
    for name in wanted:
        mine = getattr(cls, name)
        assert inspect.iscoroutinefunction(mine), name
        theirs = [p for p in inspect.signature(getattr(EngineClient, name)).parameters if p != "self"]
        assert [p for p in inspect.signature(mine).parameters if p != "self"][: len(theirs)] == theirs, name
