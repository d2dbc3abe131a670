"""One short profiling run of a model on this device, recorded as a JSON profile.

The only part of the advisor that imports torch. It times forward, backward (with the
moment each parameter's gradient is ready), the optimizer step, and our exchange itself:
the real reducers and ``BucketedExchange`` run on a ``SimulatedWorld`` of W ranks, which
records each collective's bytes, as our backends count them, and times the maths between
collectives, bucket by bucket and segment by segment.
"""

import platform
import statistics
import time

import torch
import torch.nn.functional as F

from horovod_accordion.core.schedule import Accordion
from horovod_accordion.advise.variants import LAYOUTS, shard_shape, shards_of
from horovod_accordion.core.buckets import assign_buckets
from horovod_accordion.core.collectives import Collectives, Done
from horovod_accordion.core.exchange import BucketedExchange
from horovod_accordion.core.metrics import CommunicationLog
from horovod_accordion.core.reducers import make_reducer
from horovod_accordion.torch_common.compression import Compression, PlainCompressor
from horovod_accordion.torch_common.tensors import TorchTensorOps

__all__ = ["SimulatedWorld", "layout_buckets", "measure_compute", "measure_exchange", "padded_shard", "profile_model"]

BUCKET_CAP_MB = 25  # the default of our optimizer and of DDP


CASTS = {"none": Compression.none, "fp16": Compression.fp16}  # Horovod's, where Horovod may not be built


class SimulatedWorld(Collectives):
    """``workers`` ranks that all hold this rank's gradients: each collective returns at once
    what it would return (an average of equal tensors is the tensor; an allgather or an
    all-to-all, W copies), and ``issued`` lists ``(kind, bytes)`` of what this rank would send,
    counted as our Horovod and DDP backends count ``bytes_sent``: the wire tensor's bytes."""

    def __init__(self, workers, device="cpu"):
        super().__init__(TorchTensorOps(device))
        self.workers = workers
        self.issued = []

    def size(self):
        return self.workers

    def rank(self):
        return 0

    def start_allreduce_mean(self, flat, name, compression=None):
        compression = compression or Compression.none
        wire, ctx = compression.compress(flat)
        self._send("allreduce", wire)
        return Done(compression.decompress(wire, ctx))

    def _start_allgather(self, flat, name):
        self._send("allgather", flat)
        return Done(flat.unsqueeze(0).expand(self.workers, -1))

    def _start_alltoall(self, rows, name):
        """Every rank sends this rank's rows: rank r's row for this rank is its row 0."""
        self._send("alltoall", rows)
        return Done(rows[:1].expand(self.workers, -1))

    def _send(self, kind, wire):
        size = wire.numel() * wire.element_size()
        self.count(kind, size)
        self.issued.append((kind, size))

    def take_issued(self):
        issued, self.issued = self.issued, []
        return issued


def layout_buckets(layout, variant, byte_sizes):
    """``(buckets, fusable)``: the layers of each bucket in the order they start, and whether
    its collectives are Horovod-fused dense allreduces (our optimizer's dense path)."""
    if layout not in LAYOUTS and shards_of(layout) is None:
        raise ValueError(f"layout must be one of {LAYOUTS} or hsdp:SHARDS, got {layout!r}")
    if shards_of(layout) is not None:  # an FSDP unit's exchange runs whole in its hook, as it comes
        return [[layer] for layer in reversed(range(len(byte_sizes)))], False
    if layout == "horovod" and variant.cast is not None:
        return [[layer] for layer in reversed(range(len(byte_sizes)))], True
    return assign_buckets(byte_sizes, BUCKET_CAP_MB), False


def _clock(device):
    """A timer that waits for the device's queued work first (a GPU runs asynchronously)."""
    if device.type != "cuda":
        return time.perf_counter
    return lambda: (torch.cuda.synchronize(device), time.perf_counter())[1]


def _spread(samples):
    return [round(s, 7) for s in samples]


def measure_compute(model, inputs, targets, repeats, warmup=2):
    """Forward, backward, each parameter's ready time (since backward started) and an SGD step."""
    params = [p for p in model.parameters() if p.requires_grad]
    clock = _clock(inputs.device)
    ready = [0.0] * len(params)
    handles = [p.register_post_accumulate_grad_hook(lambda _, i=i: ready.__setitem__(i, clock()))
               for i, p in enumerate(params)]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    timings = {"forward_s": [], "backward_s": [], "optimizer_s": [], "layer_ready_s": [[] for _ in params]}
    try:
        for repeat in range(warmup + repeats):
            optimizer.zero_grad()
            started = clock()
            loss = F.cross_entropy(model(inputs), targets)
            forward_done = clock()
            loss.backward()
            backward_done = clock()
            optimizer.step()
            step_done = clock()
            if repeat < warmup:
                continue
            timings["forward_s"].append(forward_done - started)
            timings["backward_s"].append(backward_done - forward_done)
            timings["optimizer_s"].append(step_done - backward_done)
            for i, moment in enumerate(ready):
                timings["layer_ready_s"][i].append(moment - forward_done)
    finally:
        for handle in handles:
            handle.remove()
    return {key: _spread(value) if key != "layer_ready_s" else [_spread(v) for v in value]
            for key, value in timings.items()}


def measure_exchange(names, grads, variant, layout, workers, level_key, repeats, warmup=1):
    """Our exchange of ``grads`` at one level on ``workers`` simulated ranks: per bucket, its
    segments' compute times and collectives; the step's bytes from the ``CommunicationLog``;
    and Accordion's check (one per step here) with its collectives."""
    world = SimulatedWorld(workers, grads[0].device)
    clock = _clock(grads[0].device)
    reducer, levels = make_reducer(variant.compression or CASTS[variant.cast], [g.shape for g in grads],
                                   world.tensors, world, PlainCompressor)
    log = CommunicationLog()
    # Without the decay rule: the learning rate it agrees rides on a step's first collective (65
    # values, ``core.rates``), whose bytes the derived world sizes (``quantized_at``) leave out.
    exchange = BucketedExchange(Accordion(names, levels, window_steps=1, interval=1, log=log, lr_decay_factor=None),
                                reducer, grads)
    buckets, fusable = layout_buckets(layout, variant, [g.numel() * g.element_size() for g in grads])
    segments = [[] for _ in buckets]  # per bucket, per segment: {"compute_s": [...], "collectives": [...]}
    check_s, check_collectives = [], []
    level = variant.level(level_key)
    for repeat in range(warmup + repeats):
        if level is not None:
            reducer.set_levels([level] * len(grads))
        runs = []
        for b, layers in enumerate(buckets):
            started = clock()
            exchange.start(b, layers, [grads[i] for i in layers])
            runs.append([(clock() - started, world.take_issued())])
        for b in range(len(buckets)):
            reduction, more = exchange.started[b], True
            while more:
                started = clock()
                more = reduction.advance()
                runs[b].append((clock() - started, world.take_issued()))
        exchange.finish()
        started = clock()
        exchange.end_step()
        check_time = clock() - started
        check_issued = world.take_issued()
        step_bytes = log.bytes_per_step[-1]
        if sum(size for run in runs for _, issued in run for _, size in issued) != step_bytes:
            raise AssertionError("the simulated collectives do not add up to the CommunicationLog's step bytes")
        if repeat < warmup:
            continue
        check_s.append(check_time)
        check_collectives = check_issued
        for b, run in enumerate(runs):
            if not segments[b]:
                segments[b] = [{"compute_s": [], "collectives": [list(c) for c in issued]} for _, issued in run]
            for segment, (seconds, _) in zip(segments[b], run):
                segment["compute_s"].append(seconds)
    for bucket in segments:
        for segment in bucket:
            segment["compute_s"] = _spread(segment["compute_s"])
    return {"buckets": [{"layers": layers, "fusable": fusable, "segments": segments[b]}
                        for b, layers in enumerate(buckets)],
            "step_bytes": step_bytes, "check_s": _spread(check_s),
            "check_collectives": [list(c) for c in check_collectives]}


def padded_shard(grad, shards):
    """The first shard of ``grad`` as FSDP2 lays it out: its first rows, zero-padded."""
    if grad.dim() == 0:
        return grad.clone()
    shard = grad.new_zeros(shard_shape(tuple(grad.shape), shards))
    rows = grad[:shard.shape[0]]
    shard[:rows.shape[0]] = rows
    return shard


def profile_model(model, inputs, targets, variants, workers, layouts=LAYOUTS, repeats=5, description=None):
    """The JSON profile of ``model`` on this device: compute, and every variant's exchange per
    layout, world size and level. In an ``hsdp:S`` layout the exchange is of each gradient's
    padded shard (its first ⌈rows / S⌉ rows), and the world sizes count replicas."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    compute = measure_compute(model, inputs, targets, repeats)
    model.zero_grad()
    F.cross_entropy(model(inputs), targets).backward()
    names, grads = [name for name, _ in named], [p.grad.detach().clone() for _, p in named]
    exchanges = {}
    for variant in variants:
        for layout in layouts:
            exchanged = grads if shards_of(layout) is None else [padded_shard(g, shards_of(layout)) for g in grads]
            for w in workers:
                for key in variant.level_keys:
                    exchanges.setdefault(variant.name, {}).setdefault(layout, {}).setdefault(str(w), {})[key] = \
                        measure_exchange(names, exchanged, variant, layout, w, key, repeats)
    return {
        "format": 1,
        **(description or {}),
        "device": "cpu" if inputs.device.type == "cpu" else torch.cuda.get_device_name(inputs.device),
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, torch {torch.__version__}",
        "repeats": repeats,
        "median_step_s": round(statistics.median(
            f + b + o for f, b, o in zip(compute["forward_s"], compute["backward_s"], compute["optimizer_s"])), 4),
        "layers": [{"name": name, "shape": list(p.shape), "bytes": p.numel() * p.element_size()} for name, p in named],
        "compute": compute,
        "exchanges": exchanges,
    }
