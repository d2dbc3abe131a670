"""Ranks whose learning rates differ switch together: the rate the decay rule sees is agreed over
the ranks once per step, whatever calls observe it; on 2 real ranks, torch and TF."""
import tensorflow as tf
import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.models import make_model
from tests.workers.torch_checks import rank_batch
from tests.workers.usage_checks import setup, train_steps  # noqa: F401 - the runner calls setup: Horovod for torch and TF


RANK_DECAY_STEPS = (4, 8)


def rank_lr(step):
    return 0.01 if step >= RANK_DECAY_STEPS[hvd.rank()] else 0.1


def assert_one_decay_at_the_last_ranks_step(checks):
    decays = [(c["step"], c["lr"]) for c in checks if c["event"] == "lr_decay"]
    assert decays == [(max(RANK_DECAY_STEPS), 0.01)], decays
    return decays


def check_ranks_whose_learning_rates_differ_switch_together_torch():
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         window_steps=2, interval=1, verify_levels=True)
    for step in range(12):
        for group in optimizer.param_groups:
            group["lr"] = rank_lr(step)
        train_steps(model, optimizer, 1, first=step)
    return assert_one_decay_at_the_last_ranks_step(optimizer.accordion_stats()["checks"])


def check_ranks_whose_learning_rates_differ_switch_together_tensorflow():
    import numpy as np
    import horovod_accordion.tensorflow as hvd_tf

    generator = np.random.default_rng(hvd_tf.rank())
    weights = tf.Variable(np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32))
    state = hvd_tf.AccordionState([weights], compression=hvd_tf.Compression.powersgd(2, 1, min_compression_rate=0),
                                  window_steps=2, interval=1, verify_levels=True)

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, weights)))
        [grad] = hvd_tf.DistributedGradientTape(tape, accordion=state).gradient(loss, [weights])
        weights.assign_sub(0.01 * grad)

    for step in range(12):
        state.observe_lr(rank_lr(step))
        train_step(tf.constant(generator.standard_normal((4, 8)).astype(np.float32)))
        state.step_end()
    return assert_one_decay_at_the_last_ranks_step(state.accordion_stats()["checks"])


def check_the_rate_is_agreed_once_per_step_whatever_calls_observe_it():
    """Each rank agrees once per step, whether its first observation comes from a gradient hook,
    from ``synchronize()`` (a bucket that no hook started: a branch only rank 0 runs) or from
    ``step()`` after an explicit ``synchronize()``: one more on one rank was a deadlock."""
    from horovod_accordion.torch import ops
    from tests.workers.torch_checks import Mixed

    agree_max, agreements = ops.TorchCollectives.agree_max, []

    def counted(collectives, value, name):
        agreements.append(value)
        return agree_max(collectives, value, name)

    def run(model, width, explicit_synchronize):
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                             window_steps=2, interval=1)
        agreements.clear()
        for step in range(3):
            x, _ = rank_batch(step)
            optimizer.zero_grad()
            model(x[:, :width]).float().square().mean().backward()
            if explicit_synchronize:
                optimizer.synchronize()
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        return len(agreements)

    ops.TorchCollectives.agree_max = counted
    try:
        counts = {name: run(model, width, explicit) for name, model, width, explicit in (
            ("hooks", make_model(), 20, False), ("explicit synchronize", make_model(), 20, True),
            ("a branch rank 0 alone runs", Mixed(), 8, False))}
    finally:
        ops.TorchCollectives.agree_max = agree_max
    assert counts == {"hooks": 3, "explicit synchronize": 3, "a branch rank 0 alone runs": 3}, counts
    return counts
