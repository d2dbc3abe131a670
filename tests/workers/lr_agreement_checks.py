"""The rate the decay rule sees is agreed over the ranks on the step's own collectives
(``horovod_accordion.core.rates``): an adaptive step makes the collectives of a static one, and
ranks whose rates differ all raise, naming each rate; on 2 real ranks, torch and TF."""
import re

import tensorflow as tf
import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.models import make_model
from tests.workers.collective_counts import count_calls
from tests.workers.torch_checks import rank_batch
from tests.workers.usage_checks import setup, train_steps  # noqa: F401 - the runner calls setup: Horovod for torch and TF


RANK_DECAY_STEPS = (4, 8)
DIFFER = r"learning rates differ \(rank: rate, None where none was observed\): \{0: 0.01, 1: 0.1\}"


def rank_lr(step):
    return 0.01 if step >= RANK_DECAY_STEPS[hvd.rank()] else 0.1


def check_ranks_whose_learning_rates_differ_raise_on_every_rank_with_each_rate_torch():
    """Rank 0's rate drops 10x at step 4, rank 1's at step 8 (a ReduceLROnPlateau stepped on each
    rank's own loss): step 4 carries both rates, and the next step's first gradient hook raises on
    both ranks, naming each rank's rate, before any level has switched."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         window_steps=2, interval=1, verify_levels=True)
    for step in range(12):
        for group in optimizer.param_groups:
            group["lr"] = rank_lr(step)
        try:
            train_steps(model, optimizer, 1, first=step)
        except RuntimeError as error:
            assert re.search(DIFFER, str(error)), error
            assert step == 5 and not any(c["event"] == "lr_decay" for c in optimizer.accordion_stats()["checks"])
            return step
    raise AssertionError("the ranks' rates differed and nothing was raised")


def tf_job(compression, **options):
    """One 8 × 6 weight trained by a traced step through Accordion's tape: each rank's data
    generator, the ``AccordionState`` (windows of ``options``, a check every window) and the step."""
    import numpy as np
    import horovod_accordion.tensorflow as hvd_tf

    generator = np.random.default_rng(hvd_tf.rank())
    weights = tf.Variable(np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32))
    state = hvd_tf.AccordionState([weights], compression=compression, interval=1, **options)

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, weights)))
        [grad] = hvd_tf.DistributedGradientTape(tape, accordion=state).gradient(loss, [weights])
        weights.assign_sub(0.01 * grad)

    return generator, state, train_step


def check_ranks_whose_learning_rates_differ_raise_on_every_rank_with_each_rate_tensorflow():
    import numpy as np
    import horovod_accordion.tensorflow as hvd_tf

    generator, state, train_step = tf_job(hvd_tf.Compression.powersgd(2, 1, min_compression_rate=0), window_steps=2,
                                          verify_levels=True)

    for step in range(12):
        try:
            state.observe_lr(rank_lr(step))
        except RuntimeError as error:
            assert re.search(DIFFER, str(error)), error
            assert step == 5 and not any(c["event"] == "lr_decay" for c in state.accordion_stats()["checks"])
            return step
        train_step(tf.constant(generator.standard_normal((4, 8)).astype(np.float32)))
        state.step_end()
    raise AssertionError("the ranks' rates differed and nothing was raised")


HOROVOD_TORCH_COLLECTIVES = ("allreduce_async_", "allgather_async", "alltoall_async", "allreduce", "allgather",
                             "broadcast_object", "allgather_object", "grouped_allreduce_async_")


def check_an_adaptive_step_makes_the_collectives_of_the_static_one_torch():
    """Every Horovod collective of 6 steps, whose rate halves at step 3: the adaptive PowerSGD
    and Quantized steps make exactly those of the static ones (no agreement of their own); with
    a check every 2 steps, PowerSGD's make one more per check (its norms). (Quantized's then run
    one exchange per level in force, which no static step has.)"""
    import horovod.torch as horovod

    def collectives(compression, window_steps):
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             window_steps=window_steps, interval=1, verify_levels=False)
        train_steps(model, optimizer, 1)  # the first step may set things up
        def run():
            for step in range(1, 7):
                for group in optimizer.param_groups:
                    group["lr"] = 0.1 if step < 3 else 0.05
                train_steps(model, optimizer, 1, first=step)
        counts = count_calls(horovod, HOROVOD_TORCH_COLLECTIVES, run)
        checks = [c for c in optimizer.accordion_stats()["checks"] if c["event"] == "check"]
        return counts, len(checks)

    report = {}
    for adaptive, static in ((Compression.powersgd(2, 1, min_compression_rate=0),
                              Compression.powersgd(2, min_compression_rate=0)),
                             (Compression.quantized(8, 4), Compression.quantized(8))):
        static_counts, _ = collectives(static, 100)
        counts = collectives(adaptive, 100)
        assert counts == (static_counts, 0), (adaptive, counts, static_counts)
        report[repr(adaptive)] = counts
    counts, checks = collectives(Compression.powersgd(2, 1, min_compression_rate=0), 2)
    static_counts = report[repr(Compression.powersgd(2, 1, min_compression_rate=0))][0]
    assert checks == 3 and sum(counts.values()) == sum(static_counts.values()) + checks, (counts, static_counts)
    return report


def check_an_adaptive_step_makes_the_collectives_of_the_static_one_tensorflow():
    """The same in a traced TF step: the graph's Horovod collectives, and the eager ones between
    steps, adaptive against static."""
    import numpy as np
    import horovod.tensorflow as horovod_tf
    import horovod_accordion.tensorflow as hvd_tf

    def collectives(compression, window_steps):
        generator, state, train_step = tf_job(compression, window_steps=window_steps, verify_levels=False)

        def run():
            for step in range(6):
                state.observe_lr(0.1 if step < 3 else 0.05)
                train_step(tf.constant(generator.standard_normal((4, 8)).astype(np.float32)))
                state.step_end()
        counts = count_calls(horovod_tf, ("allreduce", "grouped_allreduce", "allgather", "alltoall", "broadcast",
                                          "broadcast_object", "allgather_object"), run)
        checks = [c for c in state.accordion_stats()["checks"] if c["event"] == "check"]
        return counts, len(checks)

    compression = hvd_tf.Compression
    static_counts, _ = collectives(compression.powersgd(2, min_compression_rate=0), 100)
    adaptive = compression.powersgd(2, 1, min_compression_rate=0)
    assert collectives(adaptive, 100) == (static_counts, 0), static_counts
    counts, checks = collectives(adaptive, 2)
    assert checks == 3 and sum(counts.values()) == sum(static_counts.values()) + checks, (counts, static_counts)
    return counts


class LateBranch(torch.nn.Module):
    """A branch at the end of the forward that rank 0 alone runs: its gradient comes first in rank
    0's backward, while rank 1 starts its bucket last, in ``synchronize()``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second, self.branch = torch.nn.Linear(20, 8), torch.nn.Linear(8, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        out = self.second(torch.relu(self.first(x)))
        return out + self.branch(out) if hvd.rank() == 0 else out


def check_the_rate_rides_on_the_same_bucket_whichever_starts_first():
    """Issue 45 review: the rate rode on the first bucket a rank started, which a branch only rank
    0 runs makes differ between ranks (one bucket per layer): Horovod then matched collectives of
    different shapes by name. It rides on bucket 0 on every rank: 8 steps train, and the rate
    dropped at step 4 (counting from 0) rides on it and is decided before step 5, on both ranks."""
    model = LateBranch()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         window_steps=100, interval=1, bucket_cap_mb=1e-6)
    for step in range(8):
        for group in optimizer.param_groups:
            group["lr"] = 0.1 if step < 4 else 0.01
        x, y = rank_batch(step)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x)[:, :4], y).backward()
        optimizer.step()
    decays = [(c["step"], c["lr"]) for c in optimizer.accordion_stats()["checks"] if c["event"] == "lr_decay"]
    assert decays == [(5, 0.01)], decays
    return decays


def check_a_batch_switch_with_compression_none_makes_no_collective_for_the_rate():
    """Issue 45 review: ``Compression.none`` (the optimizer's default) hands its allreduce a
    compressor, which kept the rate off it, so every large step averaged the rate on its own.
    The collectives of 16 micro-batches with the decay rule equal those without it."""
    import horovod.torch as horovod

    def collectives(lr_decay_factor):
        model = make_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             batch_switch=hvd.BatchSwitch(small_batch=8, multiplier=2),
                                             window_steps=100, lr_decay_factor=lr_decay_factor, verify_levels=False)
        optimizer._exchange.load_schedule(dict(optimizer._exchange.accordion.state_dict(),
                                               current_levels=[2] * len(list(model.parameters()))))
        return count_calls(horovod, HOROVOD_TORCH_COLLECTIVES, lambda: train_steps(model, optimizer, 16))

    with_rule, without = collectives(2.0), collectives(None)
    assert with_rule == without and with_rule, (with_rule, without)
    return with_rule
