"""The DDP hook on GPU tensors (``make test-gpu``; one GPU is enough), under ``torchrun``.

``ACCORDION_DDP_BACKEND``: ``nccl`` on one rank (NCCL refuses two ranks on one GPU), or
``gloo`` on two ranks that share the GPU (Gloo copies through the host). Each compression
trains on the GPU and, in the same process, on the CPU (over Gloo) from the same weights and
data: the two must agree, send the same bytes and switch levels alike, and every state tensor
must live on the GPU. ``ACCORDION_TEST_DEVICE=cpu`` runs the same checks on the CPU only, to
test the checks themselves where there is no GPU.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.ddp import AccordionState, Compression, PowerSGD, TopK, accordion_hook
from tests.workers.models import batch_of_rank, make_model

DEVICE = os.environ.get("ACCORDION_TEST_DEVICE", "cuda")
BACKEND = os.environ.get("ACCORDION_DDP_BACKEND", "gloo")
COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16,
                "powersgd 2/1": PowerSGD(2, 1, min_compression_rate=0), "topk 0.5/0.1": TopK(0.5, 0.1)}
CPU_GROUP = None  # Gloo, for the CPU reference when the default group is NCCL's


def setup():
    global CPU_GROUP
    dist.init_process_group(BACKEND if DEVICE == "cuda" else "gloo")
    CPU_GROUP = dist.new_group(backend="gloo")
    torch.set_num_threads(1)
    return dist.get_rank()


def device():
    return torch.device("cuda", 0) if DEVICE == "cuda" else torch.device("cpu")


def train(on, compression, steps=12, amp=False):
    """Windows of 2 steps, a check every window, inputs ×10 from step 6: the levels move."""
    group = None if on.type == "cuda" else CPU_GROUP
    module = make_model(seed=0).to(on)
    model = DistributedDataParallel(module, device_ids=[on] if on.type == "cuda" else None, process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(on.type, enabled=amp)
    state = AccordionState(group, compression, model=model, optimizer=optimizer, window_steps=2, interval=1,
                           grad_scaler=scaler)
    model.register_comm_hook(state, accordion_hook)
    for step in range(steps):
        x, y = batch_of_rank(dist.get_rank(), step, scale=10.0 if step >= 6 else 1.0)
        optimizer.zero_grad()
        with torch.autocast(on.type, dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x.to(on)), y.to(on))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model.module, state


def state_devices(state):
    exchange = state._exchange
    tensors = [t for entries in exchange.reducer.state().values() for t in entries.values()
               if isinstance(t, torch.Tensor)] + list(exchange.accumulated)
    return {t.device.type for t in tensors}


def same_on_every_rank(model):
    total = torch.stack([p.detach().double().sum() for p in model.parameters()]).cpu()
    gathered = [torch.empty_like(total) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, total, group=CPU_GROUP)
    return all(torch.equal(gathered[0], row) for row in gathered)


def check_every_compression_on_the_gpu_matches_the_cpu():
    report = {}
    for name, compression in COMPRESSIONS.items():
        model, state = train(device(), compression)
        reference, reference_state = train(torch.device("cpu"), compression)
        assert state_devices(state) <= {device().type}, (name, state_devices(state))
        # Different kernels add up in other orders; fp16 also rounds on the wire.
        tolerance = 1e-3 if name == "fp16" else 1e-4
        worst = 0.0
        for (layer, p), q in zip(model.named_parameters(), reference.parameters()):
            error = float((p.detach().cpu() - q.detach()).norm() / q.detach().norm())
            assert error <= tolerance, f"{name}, {layer}: GPU and CPU differ, relative error {error:.2e}"
            worst = max(worst, error)
        assert same_on_every_rank(model), name
        stats, reference_stats = state.accordion_stats(), reference_state.accordion_stats()
        assert stats["bytes_per_step"] == reference_stats["bytes_per_step"], name
        levels = [check["levels"] for check in stats["checks"]]
        assert levels == [check["levels"] for check in reference_stats["checks"]], name
        report[name] = {"worst relative error": worst, "checks": len(levels), "bytes": stats["total_bytes_sent"]}
    return report


def check_amp_fp16_with_a_grad_scaler_trains_on_the_gpu():
    """``torch.autocast(float16)`` and a ``GradScaler`` around the hooked model: the weights
    move, stay finite and equal on every rank, and the state stays on the GPU."""
    report = {}
    for name in ("powersgd 2/1", "topk 0.5/0.1"):
        model, state = train(device(), COMPRESSIONS[name], amp=True)
        start = make_model(seed=0)
        assert all(torch.isfinite(p).all() for p in model.parameters()), name
        moved = max(float((p.detach().cpu() - q).abs().max()) for p, q in zip(model.parameters(), start.parameters()))
        assert moved > 0, name
        assert same_on_every_rank(model), name
        assert state_devices(state) <= {device().type}, name
        report[name] = {"moved": moved, "steps": state.iter}
    return report
