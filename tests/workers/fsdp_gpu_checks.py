"""FSDP2 with Accordion's all-reduce hook on one GPU (``make test-gpu``), under ``torchrun`` with
NCCL: a 1 × 1 mesh, so the hook runs on FSDP's all-reduce stream as it does between replicas.
``ACCORDION_TEST_DEVICE=cpu`` runs the check on the CPU over Gloo, to test it where there is no GPU.
"""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from horovod_accordion.fsdp import AccordionState, Compression
from tests.workers.models import batch_of_rank, make_model

DEVICE = os.environ.get("ACCORDION_TEST_DEVICE", "cuda")


def setup():
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    torch.set_num_threads(1)
    return dist.get_rank()


def check_a_reduce_dtype_and_accumulation_keep_the_hooks_buffer_until_its_kernels_ran():
    """Issue 45: bf16 parameters reduced in fp32 (a reduce_dtype other than theirs) and two
    micro-batches per step, where FSDP frees the reduce-scatter output after the hook and the next
    unit's reduce-scatter may take its memory: the hook records it on its stream. On one replica
    ``Compression.none`` averages nothing, so each step's gradients equal native FSDP's, bitwise,
    and every step of PowerSGD stays finite and alike on a second run."""
    on = torch.device(DEVICE, 0) if DEVICE == "cuda" else torch.device("cpu")
    mesh = init_device_mesh(on.type, (1, 1), mesh_dim_names=("replicate", "shard"))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def run(compression):
        model = make_model(seed=0).to(on)
        for block in (model[0], model[2]):
            fully_shard(block, mesh=mesh["shard"], mp_policy=policy)
        fully_shard(model, mesh=mesh["shard"], mp_policy=policy)
        if compression is not None:
            AccordionState(mesh, compression, model=model, window_steps=2, interval=1)
        grads = []
        for step in range(8):
            model.zero_grad()
            for micro in range(2):
                model.set_requires_gradient_sync(micro == 1)
                x, y = batch_of_rank(dist.get_rank(), 2 * step + micro)
                torch.nn.functional.cross_entropy(model(x.to(on)), y.to(on)).backward()
            grads.append([p.grad.to_local().detach().float().cpu().clone() for p in model.parameters()])
        return grads

    native, ours = run(None), run(Compression.none)
    assert all(torch.equal(a, b) for step_a, step_b in zip(native, ours) for a, b in zip(step_a, step_b))
    first, second = run(Compression.powersgd(2, 1, min_compression_rate=0)), \
        run(Compression.powersgd(2, 1, min_compression_rate=0))
    assert all(torch.isfinite(g).all() and torch.equal(g, h)
               for step_a, step_b in zip(first, second) for g, h in zip(step_a, step_b))
    return len(native)
