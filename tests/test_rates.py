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
from horovod_accordion.torch_common.tensors import TorchTensorOps
from tests.test_policies import LONE_SHAPES, LoneRank, lone_exchange


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


class RecordingRank(LoneRank):
    """One rank that records each collective it starts: kind, name and elements."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.started = []

    def start_allreduce_mean(self, flat, name, compression=None):
        self.started.append(("allreduce", name, flat.numel()))
        return super().start_allreduce_mean(flat, name, compression)

    def _start_allgather(self, flat, name):
        self.started.append(("allgather", name, flat.numel()))
        return super()._start_allgather(flat, name)

    def _start_alltoall(self, rows, name):
        self.started.append(("alltoall", name, rows.numel()))
        return super()._start_alltoall(rows, name)


@pytest.mark.parametrize("compression, carrier", [(PowerSGD(2, 1, min_compression_rate=0), "allreduce"),
                                                  (TopK(0.5, 0.1, wire="sparse"), "allreduce"),
                                                  (Quantized(8, 4), "alltoall")])
def test_the_rate_rides_on_the_first_collective_and_is_decided_at_the_next_step(compression, carrier):
    """An allreduce (PowerSGD's P; TopK's dense part, started before its values' all-gather) or
    an all-to-all (the quantized shots) carries it, in 65 more elements (one rank: one row), and
    nothing else is sent for it;
    the averages are those of a step without it; the drop decides a decay before the step after
    the one that carried it."""
    tensors = TorchTensorOps()
    collectives = RecordingRank(tensors)
    reducer, levels = make_reducer(compression, LONE_SHAPES, tensors, collectives, None)
    schedule = Accordion(["w", "b", "v"], levels, window_steps=100, interval=1)
    exchange = lone_exchange(schedule, reducer)
    plain_collectives = RecordingRank(tensors)
    plain, _ = make_reducer(compression, LONE_SHAPES, tensors, plain_collectives, None)
    grads = [torch.ones(shape) for shape in LONE_SHAPES]
    for step, lr in enumerate((1.0, 1.0, 0.1, 0.1)):
        exchange.observe_lr(lr)
        assert [e["event"] for e in schedule.log.checks] == (["lr_decay"] if step == 3 else []), step
        exchange.start(0, range(3), grads)
        outputs = exchange.finish()
        exchange.end_step()
        reference = plain.reduce(grads)
        assert all(torch.equal(outputs[i], reference[i]) for i in range(3)), step
        ours, theirs = collectives.started, plain_collectives.started
        assert [kind for kind, *_ in ours] == [kind for kind, *_ in theirs], (ours, theirs)
        grown = [k for k, (a, b) in enumerate(zip(ours, theirs)) if a[2] != b[2]]
        assert len(grown) == 1 and ours[grown[0]][0] == carrier and ours[grown[0]][2] == theirs[grown[0]][2] + \
            RATE_VALUES, (ours, theirs)
        collectives.started.clear()
        plain_collectives.started.clear()


def test_a_world_size_not_known_at_tracing_leaves_fp64_alone_exact():
    """A traced TF step under hvd.elastic reads the world size when it runs: fp32 can't be
    bounded then (the elastic Keras job failed on int() of a symbolic size)."""
    assert exact_average("float64", None) and not exact_average("float32", None)


def test_an_all_gather_carries_the_rate_in_leading_columns_of_any_dtype():
    """Each rank's row gains the 65 values in front, in the buffer's dtype (int32 words here);
    the result is the buffer's own rows, and the mean is held for the host."""
    tensors = TorchTensorOps()
    collectives = RecordingRank(tensors)
    sent = tensors.host_state(np.array(rate_values(0.25)), "sent")
    means = tensors.host_state(np.zeros(RATE_VALUES), "means")
    collectives.carry(sent, means)
    words = torch.arange(7, dtype=torch.int32)
    gathered = collectives.start_allgather(words, "words").wait()
    assert torch.equal(gathered, words.view(1, -1)) and collectives.started == [("allgather", "words", 72)]
    assert rates_of([tensors.read_host_state(means)]) == [0.25] and not collectives.riding()
