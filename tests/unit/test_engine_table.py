"""Engines are rows of one table (`controller_runtime.engines`): a new row is all an engine needs,
and a name without a row is refused, never run with another engine's client or command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rljob_operator.manifests.engine import engine_pods, head_address
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podspec import model_path

from controller_runtime.api.spec import Engine, RLJobSpec
from controller_runtime.clients.factory import make_engine_client
from controller_runtime.clients.sglang import SGLangClient
from controller_runtime.clients.vllm import VLLMClient
from controller_runtime.engines import (
    ENGINES,
    WEIGHT_SYNC,
    EngineDescriptor,
    EngineLaunch,
    UnknownEngine,
    register_engine,
    unregister_engine,
)
from controller_runtime.ports import CellRequest

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "unit" / "golden" / "jobs" / "multinode-vllm.yaml"  # two pods per cell


class DummyClient:
    """Stands for a new engine's client: made by the table, with the options the factory passes."""

    def __init__(self, endpoint: str, **options: Any) -> None:
        self.endpoint = endpoint
        self.options = options


def dummy_argv(launch: EngineLaunch) -> list[str]:
    return ["dummy-serve", launch.model, "--port", str(launch.inference.port), "--rank", str(launch.pod_index),
            "--join", launch.head]


@pytest.fixture
def dummy() -> Iterator[EngineDescriptor]:
    row = register_engine(EngineDescriptor("dummy", DummyClient, dummy_argv, env=(("DUMMY_MODE", "on"),),
                                           health_route="/ready", dist_init=("dummy-join", 7000)))
    try:
        yield row
    finally:
        unregister_engine("dummy")


def job_with(engine: str) -> dict[str, Any]:
    body = yaml.safe_load(JOB.read_text())
    body["spec"]["inference"]["engine"] = engine
    return body


def test_a_registered_engine_gets_a_manifest_and_a_client(dummy: EngineDescriptor) -> None:
    view = JobView.of(job_with("dummy"))
    assert view.spec.inference.engine == "dummy" and view.spec.inference.pods_per_cell == 2
    cell = CellRequest(name=f"{view.name}-cell-0", index=0, generation=1)
    head, worker = (pod["spec"]["containers"][0] for pod in engine_pods(view, cell))
    port, model, join = str(view.spec.inference.port), model_path(view.spec.model), head_address(view, cell)
    assert head["command"] == ["dummy-serve", model, "--port", port, "--rank", "0", "--join", join]
    assert worker["command"] == ["dummy-serve", model, "--port", port, "--rank", "1", "--join", join]
    assert {"name": "DUMMY_MODE", "value": "on"} in head["env"]
    assert not [e for e in head["env"] if e["name"].startswith("VLLM_")], "no other engine's settings"
    assert head["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {"name": "dummy-join", "containerPort": 7000, "protocol": "TCP"} in head["ports"]
    client = make_engine_client("dummy", "http://10.0.0.1:8000", timeout=3.0)
    assert isinstance(client, DummyClient) and client.endpoint == "http://10.0.0.1:8000"
    assert client.options["timeout"] == 3.0


def test_an_engine_without_a_row_is_refused_by_the_spec_and_the_factory() -> None:
    """Any engine that was not vLLM got SGLang's client, any that was not SGLang vLLM's argv."""
    with pytest.raises(ValidationError, match="unknown engine 'dummy'") as err:
        RLJobSpec.model_validate(job_with("dummy")["spec"])
    assert err.value.errors()[0]["loc"] == ("inference", "engine")
    with pytest.raises(UnknownEngine, match=r"spec\.inference\.engine: unknown engine 'dummy'"):
        make_engine_client("dummy", "http://10.0.0.1:8000")


def test_the_built_in_engines_keep_their_clients() -> None:
    assert isinstance(make_engine_client(Engine.vllm, "http://e:1"), VLLMClient)
    assert isinstance(make_engine_client("sglang", "http://e:1"), SGLangClient)
    assert set(ENGINES) == {e.value for e in Engine}


def test_the_crd_admits_exactly_the_table_s_engines() -> None:
    crd = yaml.safe_load((REPO / "crds" / "rljob.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["inference"]["properties"]["engine"]["enum"] == list(ENGINES)


def test_every_weight_sync_method_has_a_row_and_every_engine_names_known_methods() -> None:
    from controller_runtime.api.spec import WeightUpdateMethod

    assert set(WEIGHT_SYNC) == {m.value for m in WeightUpdateMethod}
    assert all(row.weight_methods <= set(WEIGHT_SYNC) for row in ENGINES.values())
    assert WEIGHT_SYNC["nccl"].gpus and not WEIGHT_SYNC["gloo"].gpus and WEIGHT_SYNC["disk"].shared_storage
