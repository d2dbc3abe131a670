"""Bad configurations raise ValueError in a process where Horovod was never initialised:
so the check happens before any Horovod call, let alone a collective."""
import pytest
import torch

import horovod_accordion.ddp as ddp
import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression


def optimizer(**kwargs):
    model = torch.nn.Linear(4, 3)
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


@pytest.mark.parametrize("make, message", [
    (lambda: Compression.powersgd(0), "low_rank must be an integer >= 1"),
    (lambda: Compression.powersgd(2, 0), "high_rank must be an integer >= 1"),
    (lambda: Compression.powersgd(1, 2), "must not exceed low_rank"),
    (lambda: Compression.powersgd(1.5), "low_rank must be an integer"),
    (lambda: Compression.topk(0.0), r"fraction in \(0, 1\]"),
    (lambda: Compression.topk(0.5, 1.2), r"fraction in \(0, 1\]"),
    (lambda: Compression.topk(0.1, 0.5), "must not exceed low_fraction"),
    (lambda: Compression.cast(torch.bfloat16), "rejects bf16 allreduce"),
    (lambda: Compression.cast(torch.int8), "unknown compression dtype"),
    (lambda: optimizer(compression="powersgd"), "compression must be"),
    (lambda: optimizer(op=hvd.Adasum), "Adasum"),
    (lambda: optimizer(gradient_predivide_factor=2.0, op=hvd.Sum), "gradient_predivide_factor"),
    (lambda: optimizer(backward_passes_per_step=0), "backward_passes_per_step"),
    (lambda: optimizer(compression=Compression.topk(0.5, 0.1), eta=0.0), "eta"),
    (lambda: optimizer(compression=Compression.topk(0.5, 0.1), interval=0), "interval"),
    (lambda: optimizer(compression=Compression.topk(0.5, 0.1), window_steps=2.5), "window_steps"),
    (lambda: optimizer(compression=Compression.topk(0.5, 0.1), lr_decay_factor=0.5), "lr_decay_factor"),
    (lambda: optimizer(named_parameters=[("w", torch.nn.Parameter(torch.ones(1)))]), "were not named"),
    # A policy that weighs levels, with one level to choose from, is refused rather than ignored
    (lambda: optimizer(compression=Compression.powersgd(2), policy="error_budget"), "one level"),
    (lambda: optimizer(policy=hvd.PhaseSchedule(total_windows=3)), "no levels"),
    (lambda: ddp.AccordionState(compression=ddp.Compression.fp16, policy="error_budget"), "no levels"),
])
def test_bad_configuration_raises_before_horovod_is_touched(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_rank_above_matrix_size_is_clamped():
    from horovod_accordion.core.compression import clamped_rank, powersgd_compresses
    assert clamped_rank(64, (32, 3, 3, 3)) == 27
    assert clamped_rank(64, (8, 100)) == 8
    assert not powersgd_compresses((10,), Compression.powersgd(1, min_compression_rate=0))


def test_fp16_compressor_is_a_horovod_compressor():
    from horovod.torch.compression import Compressor
    tensor = torch.tensor([1.5, -2.25], dtype=torch.float64)
    wire, ctx = Compression.fp16.compress(tensor)
    assert issubclass(Compression.fp16, Compressor) and wire.dtype == torch.float16
    back = Compression.fp16.decompress(wire, ctx)
    assert back.dtype == torch.float64 and back.tolist() == [1.5, -2.25]
