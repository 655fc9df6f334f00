"""A full update window through the operator's controller API onto a real vLLM engine.

One RLJob of two cells on the test cluster: cell 0 is a real vLLM CPU server on the tiny
model (started by the cluster's process agent from the pod's command, exactly as the
manifest builder wrote it), cell 1 a light stand-in. The test plays the trainer: it opens
the window, reloads the engine's weights from another checkpoint (`collective_rpc
reload_weights`), sets the version, and closes the window; the operator records each step
in status before it answers.
"""

from __future__ import annotations

import importlib.util

import pytest

from controller_runtime.clients.vllm import VLLMClient
from tests.fixtures.vllm_server import ALT_SEED, BASE_SEED, tiny_model_path
from tests.integration.operator_harness import (
    Kube,
    OperatorProcess,
    call,
    condition,
    control_rbac,
    engine_states,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (scripts/install-env)"),
]


async def test_update_window_reloads_weights_on_a_real_vllm_engine(cluster, namespace, tmp_path):
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    base, alt = tiny_model_path(BASE_SEED), tiny_model_path(ALT_SEED)
    kube.apply(make_rljob("real", replicas=2, standin_cells="1", model_path=base, startup_deadline=600))
    op = OperatorProcess(cluster, namespace, tmp_path)
    try:
        trainer, _ = control_rbac(kube, "real")
        wait_for(lambda: kube.status("real").get("ready") == "2/2", 600, interval=1, what="real vLLM cell serving")
        assert condition(kube.status("real"), "Ready")["status"] == "True"

        code, window, _ = call(op.api, namespace, "real", "start_update_weights", {"holder": "trainer-0"}, trainer)
        assert code == 200, window
        assert [e["cell"] for e in window["engines"]] == ["real-cell-0", "real-cell-1"]
        assert kube.status("real")["lock"]["snapshot"] == window["snapshot"]
        real = VLLMClient(window["engines"][0]["endpoint"])
        try:
            before = await real.weight_checksums()
            await real.reload_weights(str(alt))
            await real.update_weight_version("1")
            after = await real.weight_checksums()
            assert after.keys() == before.keys() and after != before
        finally:
            code, body, _ = call(op.api, namespace, "real", "end_update_weights",
                                 {"snapshot": window["snapshot"], "weightVersion": "1"}, trainer)
        assert code == 200, body
        status = kube.status("real")
        assert status["weightVersion"] == "1" and "lock" not in status
        assert engine_states(status) == {"real-cell-0": "Serving", "real-cell-1": "Serving"}
        assert all(e.get("weightVersion") == "1" for e in status["engines"])
        try:
            assert await real.get_weight_version() == "1"
            out = await real.completions(prompt=[1, 2, 3], max_tokens=2, temperature=0.0)
            assert out
        finally:
            await real.close()
        assert any(e["reason"] == "WeightsUpdated" for e in kube.events("real"))
    finally:
        op.stop()
        release_rljobs(cluster, namespace)
