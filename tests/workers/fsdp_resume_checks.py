"""A new launch that resumes ``fsdp_checks``' checkpoint: bitwise that run's end. Then a
checkpoint of another layout (1 replica × 4 shards, the same 4 ranks) is refused."""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

from horovod_accordion.fsdp import AccordionState, PowerSGD
from tests.workers.fsdp_checks import CHECKPOINTED, hooked, local_shards, make_model, setup, shared_dir, sharded, train

__all__ = ["setup"]


def resumed_bitwise(label):
    """The checkpoint ``fsdp_checks`` took with ``CHECKPOINTED[label]``, resumed for the 7 steps
    that run went on for: its parameters, checks and step count at the end, bitwise."""
    model, optimizer, state = hooked(CHECKPOINTED[label](), window_steps=4)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optimizer": optimizer_state, "accordion": state}
    dcp.load(loaded, checkpoint_id=os.path.join(shared_dir(), f"checkpoint-{label}"))
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    assert state.iter == 5
    train(model, optimizer, 7, first=5, regime_at=3)
    end = torch.load(os.path.join(shared_dir(), f"end-{label}{dist.get_rank()}.pt"), weights_only=False)
    for name, p, q in zip([n for n, _ in model.named_parameters()], local_shards(model), end["shards"]):
        assert torch.equal(p, q), (name, float((p - q).abs().max()))
    mine, theirs = state.accordion_stats()["checks"], end["stats"]["checks"]
    assert mine == theirs, [(a, b) for a, b in zip(mine, theirs) if a != b][:2] or (len(mine), len(theirs))
    assert state.iter == end["iter"] == 12, (state.iter, end["iter"])
    return {"levels": state.levels, "checks": len(end["stats"]["checks"])}


def check_a_new_launch_resumes_the_checkpoint_bitwise():
    return resumed_bitwise("powersgd")


def check_a_new_launch_resumes_a_quantized_checkpoint_bitwise():
    """Both error memories are each rank's own: a broadcast or a shared copy would not end bitwise."""
    return resumed_bitwise("quantized")


def check_a_checkpoint_of_another_layout_is_refused_on_every_rank():
    other = init_device_mesh("cpu", (1, 4), mesh_dim_names=("replicate", "shard"))
    model = sharded(make_model(), other["shard"])
    state = AccordionState(other, PowerSGD(2, 1, min_compression_rate=0), model=model, window_steps=4)
    try:
        dcp.load({"accordion": state}, checkpoint_id=os.path.join(shared_dir(), "checkpoint-powersgd"))
    except ValueError as error:
        assert "saved on another layout" in str(error) and "2 replicas × 2 shards" in str(error), str(error)
        return str(error)
    raise AssertionError("a checkpoint of 2 × 2 loaded into 1 × 4")
