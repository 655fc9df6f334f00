"""`method: nccl` into vLLM's own NCCL weight-transfer engine: the parts that run without a GPU.

The payloads are parsed by vLLM's own dataclasses (the ones its /init_weight_transfer_engine
and /update_weights routes build from the request), so a field we name wrong or a dtype name
vLLM cannot resolve fails here. The broadcast itself needs CUDA and has not run in this project.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from rljob_client.weights.broadcast import TrainerGroup, VLLMReceiver, receiver_for, sender_group_class
from rljob_client.weights.buckets import plan_buckets
from rljob_client.weights.native_nccl import (
    NativeNCCLGroup,
    VLLMNativeReceiver,
    init_payload,
    update_payload,
    use_native,
)
from rljob_client.weights.process_group import nccl_transport
from rljob_client.weights.transport import TransportContext

from controller_runtime.api.spec import PauseMode
from controller_runtime.clients import VLLMClient


def tensors() -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": torch.zeros(300, 1024, dtype=torch.bfloat16),  # 600 KB
        "model.layers.0.input_layernorm.weight": torch.zeros(1024, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(1024, 1024, dtype=torch.bfloat16),  # 2 MiB: direct
        "model.layers.0.mlp.gate_proj.bias": torch.zeros(16, dtype=torch.float32),
    }


def test_the_init_payload_is_what_vllms_nccl_engine_parses() -> None:
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    payload = init_payload("10.0.0.7", 29511, 1, 3)
    info = NCCLWeightTransferInitInfo(**payload)
    assert (info.master_address, info.master_port, info.rank_offset, info.world_size) == ("10.0.0.7", 29511, 1, 3)
    assert info.packed is False  # one broadcast per tensor: no buffer geometry to agree on


def test_every_buckets_update_payload_names_its_tensors_in_order_with_dtypes_vllm_resolves() -> None:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    sent = tensors()
    buckets = plan_buckets(sent.items(), bucket_bytes=1 << 20)
    infos = [NCCLWeightTransferUpdateInfo(**update_payload(b)) for b in buckets]
    assert [n for i in infos for n in i.names] == list(sent)
    for info in infos:
        for name, dtype_name, shape in zip(*(asdict(info)[k] for k in ("names", "dtype_names", "shapes")), strict=True):
            assert getattr(torch, dtype_name) == sent[name].dtype  # how vLLM's receive resolves it
            assert tuple(shape) == tuple(sent[name].shape)


def test_the_trainer_opens_vllms_group_for_native_receivers_and_a_torch_group_otherwise() -> None:
    client = VLLMClient("http://127.0.0.1:9")
    native, extension = receiver_for(client, native_nccl=True), receiver_for(client)
    assert isinstance(native, VLLMNativeReceiver) and native.framing == "per_tensor"
    assert isinstance(extension, VLLMReceiver) and extension.framing == "packed"
    assert sender_group_class([native, native]) is NativeNCCLGroup
    assert sender_group_class([extension]) is TrainerGroup
    with pytest.raises(ValueError, match="one kind of group"):
        sender_group_class([native, extension])


def test_vllms_group_is_nccl_only() -> None:
    with pytest.raises(ValueError, match="NCCL only"):
        NativeNCCLGroup("gloo", "127.0.0.1", 2, "rljob-weights", 5.0)


def test_vllms_engine_only_where_the_trainer_has_vllm_and_no_checksums_are_asked() -> None:
    assert use_native(check_weights=False, vllm_installed=True)
    assert not use_native(check_weights=True, vllm_installed=True)
    assert not use_native(check_weights=False, vllm_installed=False)


def test_nccl_uses_vllms_engine_unless_the_window_verifies_checksums(tmp_path: object) -> None:
    client = VLLMClient("http://127.0.0.1:9")

    def context(check: bool) -> TransportContext:
        return TransportContext(engines=lambda _: client, pause_mode=PauseMode.wait, sync_dir=tmp_path,  # type: ignore[arg-type]
                                source_model_dir=tmp_path, check_weights=check)  # type: ignore[arg-type]

    assert isinstance(nccl_transport(context(False)).receiver(client), VLLMNativeReceiver)
    assert isinstance(nccl_transport(context(True)).receiver(client), VLLMReceiver)


async def test_a_verified_window_is_refused_by_the_native_receiver_before_any_call() -> None:
    async def never(_: int) -> None:
        raise AssertionError("no bucket may be sent")

    receiver = VLLMNativeReceiver(VLLMClient("http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="no checksums"):
        await receiver.receive(plan_buckets(tensors().items()), "3", 5.0, never, digest=True)
