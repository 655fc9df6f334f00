"""The minimal trainer sharded with FSDP2 (`fully_shard`) across ranks, with sharded checkpoints.

Every rank runs this same program (spec.trainer.replicas of them; `rljob run
examples/byo-fsdp2.yaml` starts 2 on loopback). gloo on CPU, NCCL on GPUs. The loss is
minimal.py's; what changes is the sharding, the streamed export (`iter_named_tensors` gathers
one parameter at a time on every rank, rank 0 writes it) and the checkpoints
(`torch.distributed.checkpoint`: each rank writes its own shards, renamed into place on rank 0).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import rljob_client
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from rljob_client.weights.export import iter_named_tensors
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minimal import LEARNING_RATE, loss_of

SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "5"))  # steps between checkpoints; 0: none
MICRO_BATCHES = int(os.environ.get("MICRO_BATCHES", "1"))  # forward/backward passes per step (whole groups each)


def checkpoint_dir(job: rljob_client.Job, step: int) -> Path:
    return job.env.job_weights_dir / "checkpoints" / f"step-{step}"


def save(job: rljob_client.Job, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Every rank writes its shards into a temporary dir; rank 0 renames it into place once all are done."""
    final = checkpoint_dir(job, step)
    tmp = final.with_name(f".{final.name}.tmp")
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
    dist.barrier()
    if job.is_writer:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)


def resume(job: rljob_client.Job, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Load the checkpoint of the step the SDK resumes at, if there is one."""
    path = checkpoint_dir(job, job.start_step)
    if job.start_step == 0 or not (path / ".metadata").is_file():
        return False
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return True


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from the pod
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(0)
    job = rljob_client.connect()
    model = AutoModelForCausalLM.from_pretrained(job.env.model_path, torch_dtype=torch.float32)
    if cuda:
        model.cuda()
    for layer in model.model.layers:  # one FSDP unit per decoder layer, then the rest
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    if resume(job, model, optimizer):
        print(f"rank {job.env.rank}: resumed from step {job.start_step}", flush=True)
    with job:
        for batch in job.batches():  # this rank's share of the groups
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss = torch.zeros(())
            for i in range(MICRO_BATCHES):  # whole groups each: the advantages stay exact
                part = batch.shard(i, MICRO_BATCHES)
                part_loss = loss_of(model, part) * (len(part) / len(batch))  # a mean per sample, reweighted
                part_loss.backward()  # FSDP2 reduce-scatters the gradients across ranks
                loss = loss + part_loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            job.publish_weights(iter_named_tensors(model))  # all ranks: one gathered parameter at a time
            record = job.report({"loss": float(loss.detach())})
            if SAVE_EVERY and (record.step + 1) % SAVE_EVERY == 0:
                save(job, model, optimizer, record.step + 1)
            if job.is_writer:
                print(f"step {record.step}: reward {record.reward_mean:.3f} loss {record.loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
