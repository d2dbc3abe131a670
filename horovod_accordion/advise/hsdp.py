"""The step of FSDP2's hybrid sharding (replicas × shards) with our exchange on the replica all-reduce
(``horovod_accordion.fsdp``).

Each rank runs forward and backward of its own batch on the whole model. FSDP all-gathers each
layer's parameters over the shard group before its forward and again before its backward, and
reduce-scatters its gradient there: those go on the fast link (inside a node). Each rank's
padded shards are then averaged across the replicas on the slow link, with the compression's
maths (profiled on the shard shapes, layout ``hsdp:S``); the optimizer steps on the shards.

FSDP calls the exchange inside each unit's all-reduce hook, which must return with the averages,
so a unit's collectives and maths run one after the other and nothing overlaps them. The fast
collectives are added in the same way: exact on a CPU (one stream), an upper bound on a GPU,
where FSDP overlaps them with compute. The profile knows layers, not units: every layer is
taken as a unit of its own, which sends the same bytes as the real units with more latencies
(an upper bound again, by a latency per layer), and all-gathers twice (the root unit once).
Collectives are rings.
"""

from horovod_accordion.advise.predict import STATISTICS, exchange_of
from horovod_accordion.advise.schedule import Bucket, Segment, Step, step_seconds
from horovod_accordion.advise.variants import hsdp_layout, shard_shape, shards_of
from horovod_accordion.advise.wire import collective_seconds

__all__ = ["hsdp_layout", "predict_hsdp", "shard_shape", "shards_of"]


def predict_hsdp(profile, variant, shards, replicas, fast_link, slow_link, low_fraction=0.5, check_every=1):
    """``{"fastest", "median", "slowest"}`` seconds per step of ``variant`` on ``replicas`` × ``shards``
    ranks: the fast collectives on ``fast_link``, the replica exchange on ``slow_link``."""
    if not 0 <= low_fraction <= 1:
        raise ValueError(f"the fraction of steps at ℓ_low must be in [0, 1], got {low_fraction!r}")
    levels = exchange_of(profile, variant, hsdp_layout(shards), replicas)
    weights = {"fixed": 1.0} if "fixed" in levels else {"low": low_fraction, "high": 1.0 - low_fraction}
    fast = sum(2 * collective_seconds("allgather", layer["bytes"] / shards, shards, fast_link)
               + collective_seconds("reduce_scatter", layer["bytes"], shards, fast_link) for layer in profile["layers"])
    compute = profile["compute"]
    predicted = {}
    for name, statistic in STATISTICS.items():
        total = statistic(compute["forward_s"]) + statistic(compute["backward_s"]) + \
            statistic(compute["optimizer_s"]) / shards + fast
        for key, weight in weights.items():
            exchange = levels[key]
            # Each unit's exchange runs whole inside its hook: one bucket at a time.
            seconds = sum(step_seconds(Step(0.0, 0.0, [Bucket(0.0, [Segment(statistic(s["compute_s"]),
                                                                            [tuple(c) for c in s["collectives"]])
                                                                    for s in bucket["segments"]])], 0.0),
                                       replicas, slow_link) for bucket in exchange["buckets"])
            if key != "fixed":
                check_wire = sum(collective_seconds(kind, size, replicas * shards, slow_link)
                                 for kind, size in exchange["check_collectives"])
                seconds += (statistic(exchange["check_s"]) + check_wire) / check_every
            total += weight * seconds
        predicted[name] = total
    return predicted
