"""The step driver that the torch optimizer, the DDP state and the TF state share: counting a
micro-batch, the divisor and LR factor of the step it completes, and what the log records. The
workers' checks run it on real ranks (``check_batch_switch_*``, ``usage_checks``)."""

import pytest
import torch

from horovod_accordion.core.compression import PowerSGD
from horovod_accordion.core.schedule import Accordion
from horovod_accordion.core.batch import BatchSwitch, schedule_arguments
from horovod_accordion.core.reducers import make_reducer
from horovod_accordion.core.steps import StepDriver

from horovod_accordion.torch_common.tensors import TorchTensorOps
from tests.test_policies import LONE_SHAPES, LoneRank, lone_backends, lone_exchange


def driver_at_the_large_batch(multiplier=3, warmup_steps=2):
    """A driver whose schedule has switched to ``multiplier`` micro-batches per step."""
    switch = BatchSwitch(8, multiplier, warmup_steps=warmup_steps)
    reducer, levels = make_reducer(PowerSGD(2, min_compression_rate=0), LONE_SHAPES, *lone_backends(), None)
    schedule = Accordion(["w", "b", "v"], window_steps=100, interval=1,
                         **schedule_arguments(switch, levels, reducer, 1, reducer.collectives))
    exchange = lone_exchange(schedule, reducer)
    exchange.load_schedule(dict(schedule.state_dict(), current_levels=[multiplier] * 3))
    return StepDriver(exchange, switch), schedule


def test_a_micro_batch_is_counted_once_however_often_it_is_asked():
    """The README's recipe asks twice per micro-batch, in synchronize() and in step()."""
    driver, _ = driver_at_the_large_batch()
    for _ in range(3):
        assert driver.count_micro_batch(0.1) is False
    assert driver.pending_micro_batches == 1
    driver.new_micro_batch()
    assert driver.count_micro_batch(0.1) is False
    driver.new_micro_batch()
    assert driver.count_micro_batch(0.1) is True
    assert driver.count_micro_batch(0.1) is True and driver.pending_micro_batches == 0


def test_the_completed_step_is_divided_by_its_micro_batches_and_logged_with_them():
    driver, schedule = driver_at_the_large_batch(multiplier=3, warmup_steps=2)
    factors = []
    for step in range(4):
        for _ in range(3):
            driver.new_micro_batch()
            completes = driver.count_micro_batch(0.1)
        assert completes and driver.divisor == 3
        factors.append(driver.lr_factor)
        driver.end_steps()
        assert driver.divisor is None  # until the next step completes
    # Linear scaling, ramped over 2 steps after the switch: 1 + 2·1/3, 1 + 2·2/3, then 3.
    assert factors == pytest.approx([5 / 3, 7 / 3, 3.0, 3.0])
    assert schedule.step == 4 and schedule.micro_batches_accumulated == 12
    assert schedule.log.steps_extra[-1] == {"micro_batches": 3, "lr_factor": 3.0}


def test_a_decay_puts_the_small_batch_in_force_once_a_step_has_carried_the_rate():
    """The rate is agreed on the step's own collectives (``core.rates``): a drop observed during a
    large batch rides on the exchange that ends it, and the next micro-batch is a small batch."""
    driver, schedule = driver_at_the_large_batch(multiplier=3)
    grads = [torch.ones(shape) for shape in LONE_SHAPES]

    def large_batch(rates):
        for lr in rates:
            driver.new_micro_batch()
            completes = driver.count_micro_batch(lr)
        assert completes
        driver.exchange.start(0, range(len(grads)), grads)
        driver.exchange.finish()
        driver.end_steps()

    large_batch([1.0, 1.0, 1.0])
    large_batch([1.0, 0.1, 0.1])  # carries the drop
    assert schedule.levels[0] == 3
    driver.new_micro_batch()
    assert driver.count_micro_batch(0.1) is True  # the agreed drop puts the small batch in force
    assert schedule.levels[0] == 1 and driver.divisor is None


def test_a_rank_that_took_anothers_count_divides_by_the_micro_batches_it_holds():
    driver, _ = driver_at_the_large_batch(multiplier=3)
    driver.count_micro_batch(0.1)
    driver.new_micro_batch()
    driver.count_micro_batch(0.1)
    saved = driver.state_dict()
    other, _ = driver_at_the_large_batch(multiplier=3)
    other.load_state_dict(saved, held=0)
    assert other.count_micro_batch(0.1) is True and other.divisor is None  # it holds one of the three


def test_a_checkpoint_with_a_batch_switch_is_refused_without_one_and_the_reverse():
    driver, _ = driver_at_the_large_batch()
    plain = StepDriver(driver.exchange)
    with pytest.raises(ValueError, match="batch_switch"):
        plain.load_state_dict(driver.state_dict())
    with pytest.raises(ValueError, match="batch_switch"):
        driver.load_state_dict(plain.state_dict())


def test_steps_without_a_batch_switch_count_their_backward_passes():
    driver, _ = driver_at_the_large_batch()
    plain = StepDriver(driver.exchange, backward_passes_per_step=2)
    plain.end_steps(3)
    assert driver.exchange.accordion.micro_batches_accumulated == 6 and driver.exchange.accordion.step == 3
    assert plain.divisor is None and plain.lr_factor == 1.0 and plain.pending_micro_batches == 0


class OutsideTheSet(LoneRank):
    """A process that a Horovod process set of two leaves out: it must make no collective."""

    def size(self):
        return 2

    def included(self):
        return False

    def start_allgather(self, flat, name):
        raise AssertionError(f"a process outside the set started the collective {name!r}")


def test_a_process_outside_the_set_closes_no_window():
    tensors = TorchTensorOps()
    reducer, levels = make_reducer(PowerSGD(2, 1, min_compression_rate=0), LONE_SHAPES, tensors,
                                   OutsideTheSet(tensors), None)
    schedule = Accordion(["w", "b", "v"], levels, interval=1, compressed_layers=reducer.compressed)
    driver = StepDriver(lone_exchange(schedule, reducer))
    driver.observe_lr(0.1)
    driver.exchange.end_epoch()
    assert schedule.detector.windows_seen == 0
