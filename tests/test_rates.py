"""The learning rate's agreement (``horovod_accordion.core.rates``) on one process: its encoding,
the bound that makes an fp32 average exact, and the rider on each kind of collective. The ranks'
agreement and its refusal run on real ranks (``tests/workers/lr_agreement_checks.py``)."""
import numpy as np
import pytest
import torch

from horovod_accordion.core.compression import PowerSGD, Quantized, TopK
from horovod_accordion.core.rates import RATE_VALUES, exact_average, rate_values, rates_of
from horovod_accordion.core.reducers import make_reducer
from horovod_accordion.core.schedule import Accordion
from tests.test_policies import LONE_SHAPES, lone_backends, lone_exchange


@pytest.mark.parametrize("rate", [0.1, 0.05, 1e-8, 3.0, 0.0, 2.0 ** -30])
def test_a_rate_comes_back_from_its_values_bit_for_bit(rate):
    values = rate_values(rate)
    assert len(values) == RATE_VALUES and set(values) <= {0.0, 1.0}
    assert rates_of([values, [0.0] * RATE_VALUES]) == [rate, None]


def test_an_fp32_average_is_exact_up_to_the_derived_world_size():
    """W·(W + 2) < 2²³: 2895 ranks in fp32; every size in fp64; no half-precision wire."""
    assert exact_average("float32", 2895) and not exact_average("float32", 2896)
    assert exact_average("float64", 1 << 20)
    assert not exact_average("float16", 2) and not exact_average("bfloat16", 2)


def test_the_bound_holds_where_the_rounding_is_worst():
    """The counts round(mean × W) of W fp32 values 1/f (a pre-scaled 1, Horovod's
    gradient_predivide_factor), summed one by one and scaled by f/W, at the largest W the bound
    allows: each count is recovered, all ranks' or one fewer."""
    size = 2895
    for factor in (1.0, 3.0, 7.0):
        one = np.float32(1 / factor)
        for count in (size, size - 1):
            total = np.float32(0)
            for _ in range(count):
                total = np.float32(total + one)
            mean = np.float32(total * np.float32(factor / size))
            assert round(float(mean) * size) == count, (factor, count, float(mean) * size)


@pytest.mark.parametrize("compression", [PowerSGD(2, 1, min_compression_rate=0), TopK(0.5, 0.1, wire="sparse"),
                                         Quantized(8, 4)])
def test_the_rate_rides_on_the_first_collective_and_is_decided_at_the_next_step(compression):
    """An allreduce (PowerSGD's P), an all-gather (TopK's values) or an all-to-all (the quantized
    shots) carries it; the averages are those of a step without it; the drop decides a decay
    before the step after the one that carried it."""
    reducer, levels = make_reducer(compression, LONE_SHAPES, *lone_backends(), None)
    schedule = Accordion(["w", "b", "v"], levels, window_steps=100, interval=1)
    exchange = lone_exchange(schedule, reducer)
    plain, _ = make_reducer(compression, LONE_SHAPES, *lone_backends(), None)
    grads = [torch.ones(shape) for shape in LONE_SHAPES]
    for step, lr in enumerate((1.0, 1.0, 0.1, 0.1)):
        exchange.observe_lr(lr)
        assert [e["event"] for e in schedule.log.checks] == (["lr_decay"] if step == 3 else []), step
        exchange.start(0, range(3), grads)
        outputs = exchange.finish()
        exchange.end_step()
        reference = plain.reduce(grads)
        assert all(torch.equal(outputs[i], reference[i]) for i in range(3)), step
    assert not reducer.collectives.riding()


def test_a_world_size_not_known_at_tracing_leaves_fp64_alone_exact():
    """A traced TF step under hvd.elastic reads the world size when it runs: fp32 can't be
    bounded then (the elastic Keras job failed on int() of a symbolic size)."""
    assert exact_average("float64", None) and not exact_average("float32", None)
