"""FSDP2 on CPU with gloo, 2 ranks: the SDK's streamed export of a sharded model equals the unsharded
weights, and examples/trainers/fsdp2.py's sharded checkpoint (torch.distributed.checkpoint) restores
model and optimizer on every rank (real torch.distributed, two processes)."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config)


def example() -> object:
    spec = importlib.util.spec_from_file_location("fsdp2_example", ROOT / "examples" / "trainers" / "fsdp2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rank_main(rank: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist
    from rljob_client.weights.export import drain, iter_named_tensors, write_stream
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = tiny_llama()
    full = {k: v.clone() for k, v in model.state_dict().items()}
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert any(type(p).__name__ == "DTensor" for p in model.parameters())
    tensors = iter_named_tensors(model, None)
    if rank == 0:  # bucket of 4 KiB: several shards, never the whole model at once
        write_stream(tensors, Path(out) / "v1", None, 4096)
        torch.save(full, Path(out) / "full.pt")
    else:
        drain(tensors)

    fsdp2 = example()
    job = SimpleNamespace(env=SimpleNamespace(job_weights_dir=Path(out) / "job"), is_writer=rank == 0, start_step=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    trained = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    fsdp2.save(job, model, optimizer, 3)  # type: ignore[attr-defined]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert fsdp2.resume(job, model, optimizer)  # type: ignore[attr-defined]
    restored = {k: v.full_tensor() for k, v in model.state_dict().items()}
    assert all(torch.equal(restored[k], trained[k]) for k in trained)
    assert all("step" in s for s in optimizer.state.values()) and optimizer.state
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_sharded_model_streams_whole_and_its_sharded_checkpoint_restores(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    mp.spawn(rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    v1 = tmp_path / "v1"
    weight_map = json.loads((v1 / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 2
    got: dict[str, torch.Tensor] = {}
    for shard in set(weight_map.values()):
        got |= load_file(str(v1 / shard))
    full = torch.load(tmp_path / "full.pt")
    assert got.keys() == full.keys() and all(torch.equal(got[k], full[k]) for k in full)
    ckpt = tmp_path / "job" / "checkpoints" / "step-3"
    assert (ckpt / ".metadata").is_file() and len(list(ckpt.glob("*.distcp"))) == WORLD
    assert not list(ckpt.parent.glob(".*"))  # the temporary dir was renamed into place
