"""A profile's predicted step time per compression, world size and link, with its range.

Every measured time in a profile is a list of repeats; the step is predicted three times,
from every time's minimum, median and maximum, so the range is the measurement's own spread.
Accordion's step is the mix of its two levels' steps, weighted by the fraction of steps at
ℓ_low, plus its check (the norms' allreduce and the decision) once every ``check_every`` steps.
"""

import json
import math
import statistics

from horovod_accordion.advise.schedule import Bucket, Segment, Step, step_seconds
from horovod_accordion.advise.variants import parse_variant, shard_shape, shards_of
from horovod_accordion.core.compression import Quantized, TopK, padded_length, quantized_bytes
from horovod_accordion.advise.wire import collective_seconds

__all__ = ["STATISTICS", "SPREAD_LIMIT", "MissingExchange", "exchange_of", "predict", "low_fraction_from_study",
           "quantized_at", "same_at_every_world_size", "step_of", "unreliable_times"]

STATISTICS = {"fastest": min, "median": statistics.median, "slowest": max}
# A profiled time whose slowest repeat took more than this many times its fastest was measured on
# a busy machine. Only times of at least SHARE_THAT_MATTERS of the median step are checked: a
# smaller one cannot move a prediction much, and its repeats spread more.
SPREAD_LIMIT = 2.0
SHARE_THAT_MATTERS = 0.05


class MissingExchange(KeyError):
    """The profile has no exchange of ``variant`` in ``layout`` on ``workers``, and none it can be
    derived from; ``why`` says what it has and why that does not serve."""

    def __init__(self, variant, layout, workers, why):
        super().__init__(f"the profile has no exchange of {variant!r} in the {layout} layout on {workers} workers: "
                         f"{why}")
        self.variant, self.layout, self.workers, self.why = variant, layout, workers, why


def exchange_of(profile, variant, layout, workers):
    """The profiled exchange of ``variant`` in ``layout`` on ``workers``: ``{level key: exchange}``.
    One profiled on another world size serves where the exchange does not depend on it (see
    ``same_at_every_world_size``), and a Quantized one with its bytes recomputed for ``workers``
    (``quantized_at``); else a ``MissingExchange``."""
    layouts = profile["exchanges"].get(variant, {})
    sizes = layouts.get(layout, {})
    if str(workers) in sizes:
        return sizes[str(workers)]
    reusable = sorted((int(w) for w in sizes if int(w) > 1), key=lambda w: abs(w - workers))
    if reusable and workers > 1 and same_at_every_world_size(variant):
        return sizes[str(reusable[0])]
    if reusable and workers > 1 and isinstance(_compression(variant), Quantized):
        return quantized_at(profile, variant, layout, sizes[str(reusable[0])], workers)
    raise MissingExchange(variant, layout, workers, _why_not_profiled(variant, layouts, layout, workers))


def same_at_every_world_size(variant):
    """Whether ``variant``'s exchange, as profiled, is the same on every world size above 1: its
    collectives are allreduces of the same tensors (dense casts, PowerSGD's P and Q, the check's
    norms), so its bytes and maths are too, and only the wire time depends on the world, which the
    prediction computes. TopK's is not: whether its wire is sparse depends on the world size, and
    its decompression sums one row per rank. Nor is Quantized's: each layer is padded to W parts
    of whole blocks, so its bytes depend on W (``quantized_at`` recomputes them). One worker
    skips a dense allreduce."""
    try:
        return not isinstance(parse_variant(variant).compression, (TopK, Quantized))
    except ValueError:
        return False


def _compression(variant):
    """The core compression that ``variant`` names; None for a cast or a name that does not parse."""
    try:
        return parse_variant(variant).compression
    except ValueError:
        return None


def quantized_at(profile, variant, layout, levels, workers):
    """``levels`` (``{level key: exchange}``) of ``variant``, a quantized one, in ``layout``,
    profiled on another world size, with the bytes that ``workers`` ranks hand over: each layer
    is padded to W parts of whole blocks (``padded_length``), each bucket's all-to-all hands
    over all W parts of its layers at the level's bits, its all-gather one part. The maths are
    those profiled on the nearest world size: they run over the padded values, which differ from
    one world size to another by the padding alone (under W·block values a layer). The check's
    collectives (its errors' norms, of unpadded layers) do not depend on W."""
    parsed, sizes = parse_variant(variant), _exchanged_sizes(profile, layout)
    return {key: _quantized_exchange_at(exchange, sizes, parsed.level(key), parsed.compression.block_size, workers)
            for key, exchange in levels.items()}


def _exchanged_sizes(profile, layout):
    """Each layer's values as ``layout`` exchanges them: the whole layer, or in hybrid sharding
    its padded shard."""
    shards = shards_of(layout)
    return [math.prod(layer["shape"] if shards is None else shard_shape(tuple(layer["shape"]), shards))
            for layer in profile["layers"]]


def _quantized_exchange_at(exchange, sizes, bits, block, workers):
    """One level's profiled Quantized ``exchange`` with its collectives' bytes on ``workers`` ranks.
    Its layers are all at ``bits``, so each bucket issues one all-to-all and one all-gather."""
    buckets, step_bytes = [], 0
    for bucket in exchange["buckets"]:
        part = sum(quantized_bytes(padded_length(sizes[i], workers, block) // workers, bits, block)
                   for i in bucket["layers"] if sizes[i])  # an empty layer is not exchanged
        handed = {"alltoall": workers * part, "allgather": part}
        segments = [dict(segment, collectives=[[kind, handed[kind]] for kind, _ in segment["collectives"]])
                    for segment in bucket["segments"]]
        step_bytes += sum(size for segment in segments for _, size in segment["collectives"])
        buckets.append(dict(bucket, segments=segments))
    return dict(exchange, buckets=buckets, step_bytes=step_bytes)


def _why_not_profiled(variant, layouts, layout, workers):
    if not layouts:
        return "it was not profiled with this compression"
    if layout not in layouts:
        return (f"it was profiled in the {', '.join(sorted(layouts))} layout(s) only, and a layout's buckets "
                f"(hybrid sharding's shard shapes) set the maths the profile timed")
    sizes = ", ".join(map(str, sorted(map(int, layouts[layout]))))
    if workers == 1 or not isinstance(_compression(variant), TopK):
        return f"it was profiled on {sizes} workers, and one worker exchanges otherwise (a dense one not at all)"
    return (f"it was profiled on {sizes} workers, and TopK's exchange depends on the world size (whether its "
            f"wire is sparse, and a decompression that sums one row per rank)")


def step_of(profile, exchange, statistic):
    """The ``Step`` of one profiled exchange, every time taken as ``statistic`` of its repeats."""
    compute = profile["compute"]
    ready = [statistic(samples) for samples in compute["layer_ready_s"]]
    buckets = [Bucket(max(ready[i] for i in bucket["layers"]),
                      [Segment(statistic(s["compute_s"]), [tuple(c) for c in s["collectives"]])
                       for s in bucket["segments"]], bucket["fusable"])
               for bucket in exchange["buckets"]]
    return Step(statistic(compute["forward_s"]), statistic(compute["backward_s"]), buckets,
                statistic(compute["optimizer_s"]))


def predict(profile, variant, layout, workers, link, algorithm="ring", low_fraction=0.5, check_every=1):
    """``{"fastest", "median", "slowest"}`` seconds per step of ``variant`` (a profiled name)."""
    levels = exchange_of(profile, variant, layout, workers)
    weights = {"fixed": 1.0} if "fixed" in levels else {"low": low_fraction, "high": 1.0 - low_fraction}
    if not 0 <= low_fraction <= 1:
        raise ValueError(f"the fraction of steps at ℓ_low must be in [0, 1], got {low_fraction!r}")
    predicted = {}
    for name, statistic in STATISTICS.items():
        total = 0.0
        for key, weight in weights.items():
            exchange = levels[key]
            step = step_of(profile, exchange, statistic)
            if key != "fixed":
                check_wire = sum(collective_seconds(kind, size, workers, link, algorithm)
                                 for kind, size in exchange["check_collectives"])
                step.extra_s = (statistic(exchange["check_s"]) + check_wire) / check_every
            total += weight * step_seconds(step, workers, link, algorithm)
        predicted[name] = total
    return predicted


def low_fraction_from_study(path, family):
    """The fraction of steps at ℓ_low in a study record (``benchmarks/study.py``'s summary.json):
    where Accordion's bytes per rank fall between the fixed ℓ_low's and ℓ_high's. A byte-weighted
    fraction: exact when a step's layers share one level."""
    with open(path) as stream:
        rows = {row["setting"]: row["bytes_per_rank_mean"] for row in json.load(stream)["rows"]
                if row["family"] == family and row.get("variant", "default") == "default"}
    missing = {"low", "high", "accordion"} - set(rows)
    if missing:
        raise ValueError(f"{path} has no {family} rows for {sorted(missing)}")
    return (rows["accordion"] - rows["high"]) / (rows["low"] - rows["high"])


def _timed_quantities(profile, variants, layout, workers):
    """``(what, repeats)`` of every time the predictions of ``variants`` on ``workers`` use: the
    compute, and each exchange's maths per step (its segments summed repeat by repeat)."""
    compute = profile["compute"]
    yield "forward", compute["forward_s"]
    yield "backward", compute["backward_s"]
    yield "the optimizer step", compute["optimizer_s"]
    yield "the whole step", [sum(repeat) for repeat in zip(compute["forward_s"], compute["backward_s"],
                                                             compute["optimizer_s"])]
    for variant in variants:
        for w in workers:
            for key, exchange in exchange_of(profile, variant, layout, w).items():
                level = "" if key == "fixed" else f" at ℓ_{key}"
                segments = [segment["compute_s"] for bucket in exchange["buckets"] for segment in bucket["segments"]]
                yield f"{variant}'s exchange on {w} workers{level}", [sum(repeat) for repeat in zip(*segments)]
                if exchange.get("check_s"):
                    yield f"{variant}'s check on {w} workers{level}", exchange["check_s"]


def unreliable_times(profile, variants, layout, workers):
    """``[(what, slowest / fastest)]`` of the profiled times that these predictions use whose
    repeats spread by more than ``SPREAD_LIMIT``, among those that matter (``SHARE_THAT_MATTERS``)."""
    quantities = list(_timed_quantities(profile, variants, layout, workers))
    step = statistics.median(dict(quantities)["the whole step"])
    return [(what, max(repeats) / min(repeats)) for what, repeats in quantities
            if statistics.median(repeats) >= SHARE_THAT_MATTERS * step and max(repeats) > SPREAD_LIMIT * min(repeats)]
