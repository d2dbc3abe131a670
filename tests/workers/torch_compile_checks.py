"""``torch.compile`` with the Horovod torch optimizer on 2 real ranks: the optimizer's gradient
hooks fire after each parameter's gradient is accumulated, outside the compiled graphs."""
import torch

import horovod_accordion.torch as hvd
from tests.workers.models import batch_of_rank, make_model
from tests.workers.torch_precision_checks import EVERY_KIND, assert_same_on_all_ranks


def setup():
    hvd.init()
    torch.set_num_threads(1)
    return hvd.rank()


def train_every_kind(compiled, steps=6):
    results = {}
    for name, compression in EVERY_KIND.items():
        model = make_model().double()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             window_steps=2, interval=1)
        forward = torch.compile(model) if compiled else model
        for step in range(steps):
            x, y = batch_of_rank(hvd.rank(), step)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(forward(x.double()), y).backward()
            optimizer.step()
        assert_same_on_all_ranks(model)
        stats = optimizer.accordion_stats()
        results[name] = ([p.detach().clone() for p in model.parameters()],
                         (stats["bytes_per_step"], [check["levels"] for check in stats["checks"]]))
    return results


def check_a_compiled_model_gives_the_levels_bytes_and_weights_of_the_uncompiled_one():
    """Every compression kind: the same levels and bytes as the uncompiled model, the same weights
    within 1e-6 (the bound is derived in ``ddp_precision_checks``' check of the same name)."""
    eager, compiled = train_every_kind(False), train_every_kind(True)
    for name in EVERY_KIND:
        (eager_weights, eager_record), (weights, record) = eager[name], compiled[name]
        assert record == eager_record, (name, eager_record, record)
        worst = max(float((a - b).abs().max()) for a, b in zip(weights, eager_weights))
        assert worst <= 1e-6, (name, worst)
