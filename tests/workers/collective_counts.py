"""The collectives a step makes, counted as they are called: an adaptive step must make those of
its static one (``horovod_accordion.core.rates``), on Horovod, DDP and FSDP alike."""
import torch.distributed as dist


DISTRIBUTED_COLLECTIVES = ("all_reduce", "all_gather", "all_to_all_single", "broadcast", "all_gather_object",
                           "broadcast_object_list", "new_group", "reduce_scatter_tensor", "all_gather_into_tensor")


def count_calls(module, names, run):
    """How often each of ``module``'s functions ``names`` was called while ``run()`` ran."""
    counts, originals = {}, {name: getattr(module, name) for name in names}

    def counting(name):
        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return originals[name](*args, **kwargs)
        return wrapper

    for name in names:
        setattr(module, name, counting(name))
    try:
        run()
    finally:
        for name, original in originals.items():
            setattr(module, name, original)
    return counts


def count_collectives(run):
    """Every torch.distributed collective (and group made) while ``run()`` runs, by name."""
    return count_calls(dist, DISTRIBUTED_COLLECTIVES, run)


def assert_adaptive_steps_make_the_static_collectives(hooked, train, pairs, per_check=1):
    """Six steps whose rate halves at step 3: an adaptive compression makes exactly the
    collectives of its static one (no agreement of its own, no group made), and with a check
    every 2 steps, where its collectives do not depend on the levels (the first pair's PowerSGD),
    ``per_check`` more per check (its norms; sharded, their sum over the world and the world's
    non-finite counts)."""
    report = {}

    def collectives(compression, window_steps):
        model, optimizer, state = hooked(compression, window_steps=window_steps, verify_levels=False)
        train(model, optimizer, 1)  # the first step may set things up
        counts = count_collectives(lambda: train(model, optimizer, 5, first=1, decay_at=3))
        return counts, sum(c["event"] == "check" for c in state.accordion_stats()["checks"])

    for adaptive, static in pairs:
        static_counts, _ = collectives(static, 100)
        counts = collectives(adaptive, 100)
        assert counts == (static_counts, 0), (adaptive, counts, static_counts)
        report[repr(adaptive)] = static_counts
    adaptive = pairs[0][0]
    counts, checks = collectives(adaptive, 2)
    assert checks == 3 and sum(counts.values()) == sum(report[repr(adaptive)].values()) + per_check * checks, \
        (counts, report)
    return report
