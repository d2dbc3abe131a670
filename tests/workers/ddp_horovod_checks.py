"""The DDP hook against the Horovod optimizer, in one ``horovodrun -np 2`` job: each rank
also joins a torch.distributed Gloo group, so both paths train on the same ranks with the
same data."""
import socket

import torch
import torch.distributed as dist

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.ddp_checks import hooked, levels_history, loss_at, train
from tests.workers.models import make_model

COMPRESSIONS = {"powersgd 2/1": Compression.powersgd(2, 1, min_compression_rate=0),
                "topk 0.5/0.1": Compression.topk(0.5, 0.1)}


def setup():
    hvd.init()
    torch.set_num_threads(1)
    port = None
    if hvd.rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="ddp_port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size())
    return hvd.rank()


def check_ddp_hook_gradients_and_levels_equal_the_horovod_optimizers():
    """14 steps, inputs ×10 from step 6 and an LR decay at step 10, so levels go down and
    back up: every step's averaged gradients agree within 1e-6, and every check decides the
    same levels, with the same ratios."""
    report = {}
    for name, compression in COMPRESSIONS.items():
        model, optimizer, state = hooked(compression)
        ddp_averages = []
        train(model, optimizer, 14, decay_at=10, averaged=ddp_averages)

        plain = make_model()
        horovod_optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9), named_parameters=plain.named_parameters(),
            compression=compression, window_steps=2, interval=1)
        horovod_averages = []
        for step in range(14):
            if step == 10:
                horovod_optimizer.param_groups[0]["lr"] /= 4
            horovod_optimizer.zero_grad()
            loss_at(plain, step).backward()
            horovod_optimizer.synchronize()
            horovod_averages.append([p.grad.clone() for p in plain.parameters()])
            with horovod_optimizer.skip_synchronize():
                horovod_optimizer.step()

        worst = 0.0
        for step, (ours, theirs) in enumerate(zip(ddp_averages, horovod_averages)):
            for k, (a, b) in enumerate(zip(ours, theirs)):
                difference = float((a - b).abs().max())
                assert difference <= 1e-6, f"{name}, step {step}, parameter {k}: {difference:.3e}"
                worst = max(worst, difference)
        ddp_checks, horovod_checks = state.accordion_stats()["checks"], horovod_optimizer.accordion_stats()["checks"]
        assert levels_history(state.accordion_stats()) == levels_history(horovod_optimizer.accordion_stats())
        for ours, theirs in zip(ddp_checks, horovod_checks):
            for layer, ratio in ours.get("ratios", {}).items():
                other = theirs["ratios"][layer]
                assert (ratio is None and other is None) or abs(ratio - other) <= 1e-5 * max(1.0, abs(ratio)), \
                    (name, layer, ratio, other)
        levels = [str(v) for c in ddp_checks for v in c["levels"].values()]
        assert set(levels) == {str(level) for level in compression.levels}, (name, levels)
        assert state.accordion_stats()["bytes_per_step"] == horovod_optimizer.accordion_stats()["bytes_per_step"]
        report[name] = {"max_difference": worst, "checks": len(ddp_checks)}
    return report
