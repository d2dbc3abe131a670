"""Accordion on GPU tensors, every collective through NCCL, on every rank of a real
``horovodrun -np 2`` job (``make test-gpu``; rank r uses GPU r).

Each compression trains on the GPU and, in the same process, on the CPU (Gloo or MPI)
from the same weights and data; the two must agree, and every state tensor must live on
the parameter's device. ``ACCORDION_TEST_DEVICE=cpu`` runs the same checks on the CPU only,
to test the checks themselves where there is no GPU.
"""
import os

import torch
import horovod.torch as horovod

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.torch_checks import make_model

DEVICE = os.environ.get("ACCORDION_TEST_DEVICE", "cuda")
COMPRESSIONS = {
    "none": lambda: Compression.none,
    "fp16": lambda: Compression.fp16,
    "powersgd 2/1": lambda: Compression.powersgd(2, 1, min_compression_rate=0),
    "topk 0.5/0.1": lambda: Compression.topk(0.5, 0.1),
}


def setup():
    hvd.init()
    torch.set_num_threads(1)
    if DEVICE == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    return hvd.rank()


def train(device, compression, steps=12):
    """Windows of 2 steps, a check every window, inputs ×10 from step 6: the levels move."""
    model = make_model(seed=0).to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters(), compression=compression,
                                         window_steps=2, interval=1)
    for step in range(steps):
        generator = torch.Generator().manual_seed(1000 * hvd.rank() + step)
        x = torch.randn(16, 20, generator=generator) * (10.0 if step >= 6 else 1.0)
        y = torch.randint(0, 4, (16,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
    return model, optimizer


def state_devices(optimizer):
    tensors = [t for entries in optimizer._reducer.state().values() for t in entries.values()
               if isinstance(t, torch.Tensor)] + list(optimizer._exchange.accumulated)
    return {str(t.device) for t in tensors}


def check_every_compression_on_the_device_matches_the_cpu():
    device = torch.device(DEVICE, torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
    report = {}
    for name, compression in COMPRESSIONS.items():
        model, optimizer = train(device, compression())
        reference, reference_optimizer = train("cpu", compression())
        assert state_devices(optimizer) <= {str(device)}, (name, state_devices(optimizer))
        tolerance = 1e-3 if name == "fp16" else 1e-4  # different kernels; fp16 rounds on the wire
        for (layer, p), q in zip(model.named_parameters(), reference.parameters()):
            error = float((p.detach().cpu() - q.detach()).norm() / q.detach().norm())
            assert error <= tolerance, f"{name}, {layer}: GPU and CPU differ, relative error {error:.2e}"
        # Both ranks must hold the same model: the NCCL average is the same on every rank.
        total = torch.stack([p.detach().double().sum() for p in model.parameters()])
        assert torch.equal(horovod.broadcast(total.cpu(), 0, name=f"gpu.{name}"), total.cpu()), name
        levels = [check["levels"] for check in optimizer.accordion_stats()["checks"]]
        assert levels == [check["levels"] for check in reference_optimizer.accordion_stats()["checks"]], name
        report[name] = {"checks": len(levels), "bytes": optimizer.accordion_stats()["total_bytes_sent"]}
    return report


def check_quantized_two_shot_matches_the_float64_reference_on_the_device():
    """The float64 reference's values bit for bit on the device too, through Horovod's all-to-all
    and all-gather on NCCL: the quantization's operations are IEEE fp32 ones, which CUDA rounds as
    the CPU does."""
    from horovod_accordion.torch.ops import TorchCollectives
    from horovod_accordion.torch_common.tensors import TorchTensorOps
    from tests.workers.quantized_checks import two_shot_matches_the_float64_reference
    device = torch.device(DEVICE, torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
    collectives = TorchCollectives(TorchTensorOps(device), hvd.global_process_set)
    return two_shot_matches_the_float64_reference(collectives,
                                                  as_tensor=lambda array: torch.from_numpy(array).to(device))
