"""``horovod_accordion.fsdp`` on 4 real processes (``torchrun``, Gloo): FSDP2 on a 2 replicas ×
2 shards mesh, where Horovod cannot be imported (``tests/no_horovod`` shadows it).

Global rank ``r·2 + s`` holds shard ``s`` of replica ``r``: ranks {0, 2} and {1, 3} are the
replica groups that the exchange averages over, {0, 1} and {2, 3} the shard groups that FSDP
reduce-scatters over."""
import contextlib
import functools
import math
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard

import horovod_accordion.hooks.fsdp_state as fsdp_state
from horovod_accordion.advise.profile import measure_exchange, padded_shard
from horovod_accordion.advise.variants import Variant, parse_variant
from horovod_accordion.core.compression import kept_count, padded_length, quantized_bytes
from horovod_accordion.core.rates import RATE_VALUES
from horovod_accordion.ddp import AccordionState as DDPAccordionState
from horovod_accordion.fsdp import AccordionState, Compression, PhaseSchedule, PowerSGD, Quantized, TopK
from horovod_accordion.torch_common.tensors import TorchTensorOps
from tests.workers.collective_counts import assert_adaptive_steps_make_the_static_collectives
from tests.workers.models import Float64State, horovod_import_error

REPLICAS = SHARDS = 2


def setup():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    return dist.get_rank()


@functools.lru_cache(maxsize=None)
def mesh():
    return init_device_mesh("cpu", (REPLICAS, SHARDS), mesh_dim_names=("replicate", "shard"))


def make_model(seed=0, dtype=torch.float32):
    """Three units (two blocks and the root, which holds the head); 15 and 3 rows shard unevenly,
    so some shards are padded, and one rank's head shard is one row of real values, one of padding."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 15), torch.nn.ReLU(),
                               torch.nn.Linear(15, 3)).to(dtype)


def sharded(model, on, **options):
    for block in (model[0], model[2]):
        fully_shard(block, mesh=on, **options)
    return fully_shard(model, mesh=on, **options)


def batch(step, scale=1.0, dtype=torch.float32):
    """Each rank's own data, rank r's inputs (1 + r) times larger; ×``scale``."""
    generator = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    x = torch.randn(8, 12, generator=generator, dtype=torch.float64) * scale * (1 + dist.get_rank())
    return x.to(dtype), torch.randint(0, 3, (8,), generator=generator)


def train(model, optimizer, steps, first=0, decay_at=None, regime_at=None, dtype=torch.float32):
    """SGD steps; from ``regime_at`` the inputs are ×10 (the detector sees a critical regime),
    from ``decay_at`` the rate is a quarter."""
    for step in range(first, first + steps):
        if step == decay_at:
            for group in optimizer.param_groups:
                group["lr"] /= 4
        optimizer.zero_grad()
        x, y = batch(step, 10.0 if regime_at is not None and step >= regime_at else 1.0, dtype)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def hooked(compression, seed=0, dtype=torch.float32, **options):
    model = sharded(make_model(seed, dtype), mesh()["shard"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    options = dict(dict(window_steps=2, interval=1), **options)
    return model, optimizer, AccordionState(mesh(), compression, model=model, optimizer=optimizer, **options)


def every_rank(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def local_shards(model):
    return [p.to_local().detach().clone() for p in model.parameters()]


def check_horovod_is_not_importable_here():
    return horovod_import_error()


def check_none_equals_native_hsdp_bitwise():
    """``Compression.none`` on the shards is native HSDP (``fully_shard`` over the 2-D mesh) on the
    same data, bitwise over 8 steps. The bound is 0 by construction: both reduce-scatter alike over
    the shard group, then average 2 replicas, which rounds once (a + b) and halves exactly, so every
    gradient, hence every update, is the same float."""
    ours, our_optimizer, state = hooked(Compression.none)
    train(ours, our_optimizer, 8)
    native = sharded(make_model(), mesh())
    native_optimizer = torch.optim.SGD(native.parameters(), lr=0.1, momentum=0.9)
    train(native, native_optimizer, 8)
    for name, p, q in zip([n for n, _ in ours.named_parameters()], local_shards(ours), local_shards(native)):
        assert torch.equal(p, q), (name, float((p - q).abs().max()))
    assert state.iter == 8 and len(state.accordion_stats()["bytes_per_step"]) == 8
    return {"steps": 8}


def check_a_frozen_parameter_has_no_place_in_the_buffer():
    """``0.weight`` frozen (before ``0.bias`` in its unit), ``Compression.none``: bitwise native HSDP
    over 4 steps, so each layer's shard is read from its own place in FSDP's buffer, which holds the
    trainable parameters only."""
    models = []
    for on in (mesh()["shard"], mesh()):
        model = make_model()
        model[0].weight.requires_grad_(False)
        sharded(model, on)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
        if on is not mesh():
            state = AccordionState(mesh(), Compression.none, model=model, optimizer=optimizer, window_steps=2)
            assert "0.weight" not in state._layout.names
        train(model, optimizer, 4)
        models.append(model)
    for name, p, q in zip([n for n, _ in models[0].named_parameters()], *map(local_shards, models)):
        assert torch.equal(p, q), (name, float((p - q).abs().max()))


class Float64Tensors(Float64State, TorchTensorOps):
    """The reducer's maths and state in fp64, so that the comparison with the reference holds far
    above rounding on any CPU."""


@contextlib.contextmanager
def float64_reducers():
    """States built inside compute in fp64 (the tensor maths, not the collectives, are replaced)."""
    fsdp_state.TorchTensorOps = Float64Tensors
    try:
        yield
    finally:
        fsdp_state.TorchTensorOps = TorchTensorOps


class Recorder:
    """What each step of a state's exchange took in and gave out, and the levels and reducer state
    it started from (read at its first bucket: a decay seen there switches levels for the step)."""

    def __init__(self, state):
        self.state, self.exchange = state, state._exchange
        self.steps = []
        start, finish = self.exchange.start, self.exchange.finish

        def recording_start(bucket, layers, grads, **options):
            if not self.steps or self.steps[-1]["step"] != state.iter:
                self.steps.append({"step": state.iter, "inputs": {}, "outputs": {}, "levels": dict(state.levels),
                                   "state": self.reducer_state()})
            self.steps[-1]["inputs"].update({layer: grad.clone() for layer, grad in zip(layers, grads)})
            return start(bucket, layers, grads, **options)

        def recording_finish():
            outputs = finish()
            self.steps[-1]["outputs"].update({layer: value.clone() for layer, value in outputs.items()})
            return outputs

        self.exchange.start, self.exchange.finish = recording_start, recording_finish

    def reducer_state(self):
        return {group: {layer: (holder.clone() if isinstance(holder, torch.Tensor) else getattr(holder, "value", holder))
                        for layer, holder in entries.items()} for group, entries in self.exchange.reducer.state().items()}

    def end(self):
        """The state after the last step, where the next step's would be."""
        self.steps.append({"step": self.state.iter, "state": self.reducer_state()})


def reference_powersgd(grads, memories, q, rank, matrix):
    """One step of PowerSGD on one layer's shard over its replicas, in fp64 (Vogels et al. Alg. 1):
    the average, each replica's new memory and the new Q."""
    ms = [g.reshape(matrix) + memory for g, memory in zip(grads, memories)]
    query = q[:, :rank]
    p = sum(m @ query for m in ms) / len(ms)
    if rank == 1:
        p = p / torch.linalg.vector_norm(p)
    else:
        p = torch.linalg.qr(p).Q
    new_q = sum(m.T @ p for m in ms) / len(ms)
    out = p @ new_q.T
    return out, [m - out for m in ms], new_q


def reference_topk(grads, residuals, fraction):
    """One step of TopK with error feedback on one layer's shard over its replicas, in fp64."""
    ms = [g.reshape(-1) + residual for g, residual in zip(grads, residuals)]
    k = kept_count(fraction, ms[0].numel())
    kept, rests = [], []
    for m in ms:
        indices = torch.topk(m.abs(), k).indices
        ordered = m.abs().sort(descending=True).values
        if k < m.numel():  # m is the same fp64 sum as the reducer's: only a tie of non-zeros could select otherwise
            assert ordered[k - 1] > ordered[k] or ordered[k] == 0, "a tie at the TopK boundary"
        sparse = torch.zeros_like(m)
        sparse[indices] = m[indices]
        kept.append(sparse)
        rests.append(m - sparse)
    return sum(kept) / len(kept), rests


def check_powersgd_and_topk_equal_a_float64_reference_through_switches_and_a_decay():
    """PowerSGD 2/1 and TopK 0.5/0.1 on the shards, in fp64, over 14 steps with windows of 2: inputs
    ×10 from step 6 (a critical regime) and the rate a quarter from step 10 (a decay). Every step,
    on every shard, the averages, the memories or residuals and Q equal a separate fp64 reference
    of the per-shard algorithm, run from the same state on the 2 replicas' inputs; the levels
    switch both ways and the decay is seen. Bound: each reference value is a short sum of products
    of the same fp64 inputs in another order, so the two differ by a few hundred ulps of the
    largest term; 1e-10 relative to it is above that and far below any algorithmic difference.
    The detector's norms are checked against the reference too: a layer's squared norm is the
    sum of its shards' over each replica, averaged over replicas."""
    report = {}
    for name, compression in {"powersgd": PowerSGD(2, 1, min_compression_rate=0),
                              "topk": TopK(0.5, 0.1, wire="dense")}.items():
        with float64_reducers():
            model, optimizer, state = hooked(compression, dtype=torch.float64, lr_decay_factor=2.0)
        recorder = Recorder(state)
        train(model, optimizer, 14, decay_at=10, regime_at=6, dtype=torch.float64)
        recorder.end()
        history = [(c["event"], c["step"], c["levels"]) for c in state.accordion_stats()["checks"]]
        seen = {level for _, _, levels in history for level in levels.values()}
        assert seen == set(compression.levels), (name, history)
        assert any(event == "lr_decay" for event, _, _ in history), (name, history)
        reducer = state._exchange.reducer
        steps = every_rank(recorder.steps)
        worst = 0.0
        for shard in range(SHARDS):
            ranks = [replica * SHARDS + shard for replica in range(REPLICAS)]
            for t in range(14):
                before, after = [steps[r][t]["state"] for r in ranks], [steps[r][t + 1]["state"] for r in ranks]
                for layer in steps[ranks[0]][t]["inputs"]:
                    grads = [steps[r][t]["inputs"][layer] for r in ranks]
                    outputs = [steps[r][t]["outputs"][layer] for r in ranks]
                    if name == "powersgd" and layer in before[0]["ranks"]:
                        out, memories, new_q = reference_powersgd(
                            grads, [b["memory"][layer] for b in before], before[0]["q"][layer],
                            before[0]["ranks"][layer], reducer.matrices[layer])
                        pairs = [(out, o.reshape(out.shape)) for o in outputs]
                        pairs += [(m, a["memory"][layer]) for m, a in zip(memories, after)]
                        rank = before[0]["ranks"][layer]
                        pairs += [(new_q, a["q"][layer][:, :rank]) for a in after]
                    elif name == "topk" and layer in before[0]["fractions"]:
                        out, rests = reference_topk(grads, [b["residual"][layer] for b in before],
                                                    before[0]["fractions"][layer])
                        pairs = [(out, o.reshape(-1)) for o in outputs]
                        pairs += [(r, a["residual"][layer]) for r, a in zip(rests, after)]
                    else:
                        out = sum(grads) / len(grads)
                        pairs = [(out, o) for o in outputs]
                    for expected, got in pairs:
                        scale = float(expected.abs().max()) or 1.0
                        error = float((expected - got).abs().max()) / scale
                        assert error <= 1e-10, (name, shard, t, layer, error)
                        worst = max(worst, error)
        assert_detector_norms(name, state, steps)
        report[name] = {"worst relative error": worst, "checks": history}
    return report


def assert_detector_norms(name, state, steps):
    """Each check's logged norm of a layer (local: √ of the mean over replicas of ‖Δ‖², Δ the
    window's summed gradient of the whole layer, over the micro-batches in it) equals the reference
    from every rank's shard inputs; both sum the same fp64 values, in another order."""
    names = state._exchange.accordion.layer_names
    for check in state.accordion_stats()["checks"]:
        if check["event"] != "check":
            continue
        window = range(check["step"] - 2, check["step"])
        for layer, logged in check["norms"].items():
            k = names.index(layer)
            per_replica = [sum(float(sum(steps[r * SHARDS + s][t]["inputs"][k] for t in window).pow(2).sum())
                               for s in range(SHARDS)) for r in range(REPLICAS)]
            expected = math.sqrt(sum(per_replica) / REPLICAS) / len(window)  # per micro-batch in Δ
            assert abs(logged - expected) <= 1e-10 * expected, (name, check["step"], layer, logged, expected)


def check_an_adaptive_step_makes_the_collectives_of_the_static_one():
    """As on DDP (``ddp_checks``): ours across replicas are those of the static step; a check
    makes three over the world (the norms, the non-finite counts, the ranks' rates)."""
    return assert_adaptive_steps_make_the_static_collectives(hooked, train, (
        (PowerSGD(2, 1, min_compression_rate=0), PowerSGD(2, min_compression_rate=0)),
        (Quantized(8, 4), Quantized(8))), per_check=3)


def check_ranks_of_one_replica_whose_rates_differ_all_raise_at_the_check():
    """Issue 45 review: the rate rides on the replicas' collectives, so each shard's replicas
    agree; the ranks of one replica exchange nothing of ours between checks. Here shard 1's ranks
    drop their rate at step 1 and shard 0's do not: every rank raises at the check of step 2,
    naming each rank's rate, before any level differs between the shards of a layer."""
    model, optimizer, state = hooked(PowerSGD(2, 1, min_compression_rate=0))
    shard = dist.get_rank() % SHARDS
    try:
        for step in range(4):
            for group in optimizer.param_groups:
                group["lr"] = 0.05 if shard == 1 and step >= 1 else 0.1
            train(model, optimizer, 1, first=step)
    except RuntimeError as error:
        rates = {rank: 0.05 if rank % SHARDS == 1 else 0.1 for rank in range(REPLICAS * SHARDS)}
        assert f"learning rates differ (rank: rate, None where none was observed): {rates}" in str(error), error
        assert step == 1 and state.iter == 2, (step, state.iter)
        return str(error)
    raise AssertionError("the shards' rates differed and nothing was raised")


def check_levels_agree_on_every_rank_and_bytes_follow_the_shard_sizes():
    """fp32, as users train: the levels, checks and bytes are the same on every rank, both levels
    are used, and each step's bytes are the formula for the padded shards at the step's levels:
    PowerSGD sends P (n × r) and Q (m × r) of each compressed shard and every 1-D shard whole; TopK
    (dense wire at 2 replicas for these sizes, or the sparse one when cheaper) its kept entries;
    Quantized every shard, padded to whole blocks for each replica, all of it handed to the
    all-to-all and a replica's part to the all-gather. Unit 0's first collective carries the
    learning rate's 65 values (``core.rates``): fp32 on an allreduce, a byte in each row of the
    all-to-all."""
    report = {}
    for name, compression in {"powersgd": PowerSGD(2, 1, min_compression_rate=0), "topk": TopK(0.5, 0.1),
                              "quantized": Quantized(8, 4)}.items():
        model, optimizer, state = hooked(compression, verify_levels=True)
        recorder = Recorder(state)
        train(model, optimizer, 14, decay_at=10, regime_at=6)
        levels_per_step = [step["levels"] for step in recorder.steps]
        stats = state.accordion_stats()
        history = [(c["event"], c["step"], c["levels"]) for c in stats["checks"]]
        assert all(h == history for h in every_rank(history)), name
        assert {level for _, _, levels in history for level in levels.values()} == set(compression.levels), history
        layout = state._layout
        rate_bytes = RATE_VALUES * (REPLICAS if name == "quantized" else 4)
        for step, levels in enumerate(levels_per_step):
            expected = rate_bytes
            for layer_name, shape in zip(layout.names, layout.shapes):
                numel = shape.numel()
                if layer_name not in levels:
                    expected += 4 * numel
                elif name == "powersgd":
                    expected += 4 * levels[layer_name] * (shape[0] + numel // shape[0])
                elif name == "quantized":
                    expected += quantized_bytes(padded_length(numel, REPLICAS, 64), levels[layer_name], 64) * \
                        (REPLICAS + 1) // REPLICAS
                else:
                    k = kept_count(levels[layer_name], numel)
                    sparse = k < -(-8 * numel // ((4 + 2) * REPLICAS))
                    expected += 4 * (k + (k + 1) // 2) if sparse else 4 * numel
            assert stats["bytes_per_step"][step] == expected, (name, step, stats["bytes_per_step"][step], expected)
        report[name] = {"bytes_per_step": stats["bytes_per_step"], "checks": history}
    return report


def check_kept_state_is_one_shard_against_a_full_replica_for_ddp():
    """The state kept per rank is its shards': the error-feedback memory and Δ of each padded shard
    (fp32), and Q (m × ℓ_low, as large as a whole layer's: it is shared by the rows). Against the
    DDP hook's state for the same model, which keeps them for whole layers: each is its formula."""
    _, _, state = hooked(PowerSGD(2, 1, min_compression_rate=0))
    whole = make_model()
    ddp = DDPAccordionState(compression=PowerSGD(2, 1, min_compression_rate=0), model=whole, window_steps=2)

    def formula(shapes):
        return sum(4 * shape.numel() * (2 if len(shape) == 2 else 1) + (4 * shape[1] * 2 if len(shape) == 2 else 0)
                   for shape in shapes)
    assert state.kept_bytes == formula(state._layout.shapes), (state.kept_bytes, formula(state._layout.shapes))
    assert ddp.kept_bytes == formula([p.shape for p in whole.parameters()]), ddp.kept_bytes
    ddp._hook_watch.ran = True  # built to be measured, not to train
    return {"fsdp bytes per rank": state.kept_bytes, "ddp bytes per rank": ddp.kept_bytes,
            "ratio": round(state.kept_bytes / ddp.kept_bytes, 3)}


def check_mixed_precision_trains_with_every_replica_alike():
    """bf16 parameters reduced in fp32, and fp16 ones reduced in fp16 (``MixedPrecisionPolicy``),
    where FSDP pre-divides before its reduce-scatter and post-divides after the hook (by 1 at 2
    shards): adaptive PowerSGD trains on both, its inputs finite, and the 2 replicas of every
    shard end bitwise alike."""
    report = {}
    for param_dtype, reduce_dtype in ((torch.bfloat16, torch.float32), (torch.float16, torch.float16)):
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        model = sharded(make_model(), mesh()["shard"], mp_policy=policy)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = AccordionState(mesh(), PowerSGD(2, 1, min_compression_rate=0), model=model, optimizer=optimizer,
                               window_steps=2, interval=1)
        recorder = Recorder(state)
        train(model, optimizer, 6)
        shards = every_rank(local_shards(model))
        for r in range(dist.get_world_size()):
            twin = (r + SHARDS) % dist.get_world_size()
            assert all(torch.equal(a, b) for a, b in zip(shards[r], shards[twin])), (str(reduce_dtype), r)
        inputs = [g for step in recorder.steps for g in step["inputs"].values()]
        assert all(g.dtype == reduce_dtype and torch.isfinite(g).all() for g in inputs), str(reduce_dtype)
        report[f"{param_dtype} reduced in {reduce_dtype}"] = state.accordion_stats()["checks"][-1]["levels"]
    return report


def check_misuse_is_refused_at_construction_with_the_reason():
    """A 1-D mesh, native HSDP (units on the 2-D mesh), a unit on another mesh, a parameter sharded
    on dim 1, a custom divide factor, a parameter outside every unit, a model never sharded, a
    second state on the same model, a wrong compression: each a clear error, on every rank."""
    said = {}

    def refused(make, expected):
        try:
            make()
        except (TypeError, ValueError) as error:
            assert expected in str(error), (expected, str(error))
            said[expected] = str(error)
            return
        raise AssertionError(f"not refused: {expected}")

    one_d = init_device_mesh("cpu", (4,))
    refused(lambda: AccordionState(one_d, model=sharded(make_model(), one_d)), "without a replicate dimension")
    refused(lambda: AccordionState(mesh(), model=sharded(make_model(), mesh())), "native HSDP")
    refused(lambda: AccordionState(mesh(), model=sharded(make_model(), mesh()["replicate"])), "not over this mesh's")

    def on_dim_1():
        model = make_model()
        fully_shard(model, mesh=mesh()["shard"], shard_placement_fn=lambda p: Shard(1 if p.dim() == 2 and p.shape[1] % 2 == 0 else 0))
        return AccordionState(mesh(), model=model)
    refused(on_dim_1, "is sharded on dim 1")

    def divided():
        model = sharded(make_model(), mesh()["shard"])
        model.set_gradient_divide_factor(8.0)
        return AccordionState(mesh(), model=model)
    refused(divided, "custom gradient divide factor")

    def outside():
        model = make_model()
        fully_shard(model[0], mesh=mesh()["shard"])
        return AccordionState(mesh(), model=model)
    refused(outside, "outside every fully_shard unit")
    refused(lambda: AccordionState(mesh(), model=make_model()), "has no fully_shard unit")

    def twice():
        model = sharded(make_model(), mesh()["shard"])
        AccordionState(mesh(), model=model)
        return AccordionState(mesh(), model=model)
    refused(twice, "already have an all-reduce hook")
    refused(lambda: AccordionState(mesh(), "powersgd", model=sharded(make_model(), mesh()["shard"])),
            "compression must be")
    return said


def shared_dir():
    return os.environ["ACCORDION_SHARED_DIR"]


# What the mid-run checkpoints are taken with; ``fsdp_resume_checks`` resumes each.
CHECKPOINTED = {"powersgd": lambda: PowerSGD(2, 1, min_compression_rate=0), "quantized": lambda: Quantized(8, 4)}


def check_a_checkpoint_is_saved_mid_run_and_the_run_goes_on():
    """Adaptive PowerSGD, then adaptive Quantized (whose state is both error memories, each rank's
    own): 6 steps, a DCP checkpoint of the model, the optimizer and the state (in the middle of a
    window: 1 step into it), then 7 more. ``fsdp_resume_checks`` resumes from each checkpoint in a
    new launch and must reach bitwise this run's end."""
    levels = {}
    for label, compression in CHECKPOINTED.items():
        model, optimizer, state = hooked(compression(), window_steps=4)
        train(model, optimizer, 5, regime_at=3)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state, "accordion": state},
                 checkpoint_id=os.path.join(shared_dir(), f"checkpoint-{label}"))
        train(model, optimizer, 7, first=5, regime_at=3)
        torch.save({"shards": local_shards(model), "stats": state.accordion_stats(), "iter": state.iter},
                   os.path.join(shared_dir(), f"end-{label}{dist.get_rank()}.pt"))
        levels[label] = state.levels
    return levels


def check_the_advisors_hsdp_layout_has_the_states_shards_and_bytes():
    """The advisor's ``hsdp:2`` exchange (``advise.profile.padded_shard``, ``measure_exchange``) on 2
    replicas: its padded shards have FSDP's shapes, and its bytes per step are what the state
    counts, for each compression at a fixed level."""
    whole = make_model()
    x, y = batch(0)
    torch.nn.functional.cross_entropy(whole(x), y).backward()
    names = [name for name, _ in whole.named_parameters()]
    shards = [padded_shard(p.grad, SHARDS) for p in whole.parameters()]
    report = {}
    for variant in (parse_variant("none"), parse_variant("fp16"), parse_variant("topk:0.5"), parse_variant("topk:0.1"),
                    Variant("powersgd:2", compression=PowerSGD(2, min_compression_rate=0)),
                    Variant("powersgd:1", compression=PowerSGD(1, min_compression_rate=0))):
        model, optimizer, state = hooked(variant.compression or getattr(Compression, variant.cast))
        assert [tuple(s.shape) for s in shards] == [tuple(s) for s in state._layout.shapes]
        train(model, optimizer, 1)
        advised = measure_exchange(names, shards, variant, "hsdp:2", REPLICAS, "fixed", repeats=1, warmup=0)
        assert advised["step_bytes"] == state.bytes_sent_last_step, (variant.name, advised["step_bytes"],
                                                                     state.bytes_sent_last_step)
        report[variant.name] = state.bytes_sent_last_step
    return report


def check_construction_makes_every_replica_the_first_ones():
    """Models built with another seed on every rank, a frozen parameter and a buffer among them:
    once the state is built, both replicas of each shard hold the first replica's parameters,
    frozen ones included, and every rank holds rank 0's buffers, as DDP does at construction."""
    model = make_model(seed=dist.get_rank())
    model[2].weight.requires_grad_(False)
    model.register_buffer("counter", torch.tensor([float(dist.get_rank())]))
    built = local_shards(sharded(model, mesh()["shard"]))
    AccordionState(mesh(), Compression.none, model=model, window_steps=2)
    shards = every_rank(local_shards(model))
    firsts = every_rank(built)
    for r in range(dist.get_world_size()):
        assert all(torch.equal(a, b) for a, b in zip(shards[r], firsts[r % SHARDS])), r
    assert torch.equal(model.counter, torch.tensor([0.0]))


def check_a_failed_backward_leaves_the_state_ready_for_the_next_step():
    """Two failures mid-backward, on every rank, each followed by FSDP's ``reset_iter_state()``:
    an error raised by the backward of the first layer, after the other units' hooks ran (the
    state's end-of-step callback is then dropped), and a parameter unfrozen after construction,
    which the hook refuses, naming it. The failed steps are not counted: training goes on, and
    windows close as in a run without them."""
    model = make_model()
    model[0].bias.requires_grad_(False)
    sharded(model, mesh()["shard"])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    state = AccordionState(mesh(), PowerSGD(2, 1, min_compression_rate=0), model=model, optimizer=optimizer,
                           window_steps=2, interval=1)
    armed = []

    def fail_in_backward(module, inputs, output):
        if armed:
            output.register_hook(lambda grad: (_ for _ in ()).throw(ValueError("failed in backward")))
    model[0].register_forward_hook(fail_in_backward)
    train(model, optimizer, 2)
    said = []
    for make_it_fail, undo, expected in ((lambda: armed.append(1), armed.clear, "failed in backward"),
                                         (lambda: model[0].bias.requires_grad_(True),
                                          lambda: model[0].bias.requires_grad_(False), "requires_grad changed")):
        make_it_fail()
        try:
            train(model, optimizer, 1, first=2)
        except (ValueError, RuntimeError) as error:
            assert expected in str(error), str(error)
            said.append(str(error))
        else:
            raise AssertionError(f"no error: {expected}")
        undo()
        model.reset_iter_state()
    train(model, optimizer, 4, first=2)
    assert state.iter == 6 and [c["step"] for c in state.accordion_stats()["checks"]] == [2, 4, 6], \
        (state.iter, state.accordion_stats()["checks"])
    return said


def check_a_parameter_frozen_as_another_of_its_size_is_unfrozen_is_refused_naming_both():
    """Issue 45: the unit's buffer keeps its size when ``0.bias`` is unfrozen as ``2.bias`` (the
    same shape, in the same unit) is frozen; the layout compared sizes only, and ``2.bias``'s
    error feedback, Δ and name went to ``0.bias``'s gradient. Refused now, naming both."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    model[0].bias.requires_grad_(False)
    fully_shard(model, mesh=mesh()["shard"])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    AccordionState(mesh(), PowerSGD(2, 1, min_compression_rate=0), model=model, optimizer=optimizer, window_steps=2,
                   interval=1)
    for step in range(2):
        optimizer.zero_grad()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    model[0].bias.requires_grad_(True)
    model[2].bias.requires_grad_(False)
    x, y = batch(2)
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    except RuntimeError as error:
        assert "'0.bias' (unfrozen), '2.bias' (frozen)" in str(error), str(error)
        return str(error)
    raise AssertionError("a parameter swapped for another of its size went unnoticed")


class WithABranch(torch.nn.Module):
    """``make_model``, plus a unit whose second layer only the first replica uses: the other
    replica's ranks have no gradient for it."""

    def __init__(self):
        super().__init__()
        self.body = make_model()
        self.side = Side()

    def forward(self, x):
        return self.body(x) + self.side(x, dist.get_rank() < SHARDS)


class Side(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(12, 3), torch.nn.Linear(12, 3)

    def forward(self, x, use_b):
        return self.a(x) + self.b(x) if use_b else self.a(x)


def check_a_parameter_unused_on_one_replica_keeps_the_layout():
    """``side.b`` has gradients on the first replica only: its zeros are reduce-scattered on the
    other (``set_reduce_scatter_unused_params``, which the state sets), so every unit's buffer
    keeps its layout. ``Compression.none`` equals native HSDP with the same setting, bitwise."""
    models = []
    for on in (mesh()["shard"], mesh()):
        model = WithABranch()
        for unit in (model.body[0], model.body[2], model.side, model):
            fully_shard(unit, mesh=on)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if on is mesh():
            model.set_reduce_scatter_unused_params(True)
        else:
            AccordionState(mesh(), Compression.none, model=model, optimizer=optimizer, window_steps=2)
        train(model, optimizer, 3)
        models.append(model)
    for name, p, q in zip([n for n, _ in models[0].named_parameters()], *map(local_shards, models)):
        assert torch.equal(p, q), (name, float((p - q).abs().max()))


def check_micro_batches_without_sync_make_one_step():
    """Two micro-batches per step, the first under ``set_requires_gradient_sync(False)``: one step
    each for the state, and ``Compression.none`` equals native HSDP bitwise over 3 steps."""
    models, states = [], []
    for on in (mesh()["shard"], mesh()):
        model = sharded(make_model(), on)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if on is not mesh():
            states.append(AccordionState(mesh(), Compression.none, model=model, optimizer=optimizer, window_steps=2))
        for step in range(3):
            optimizer.zero_grad()
            for micro in range(2):
                model.set_requires_gradient_sync(micro == 1)
                x, y = batch(10 * step + micro)
                torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        models.append(model)
    assert states[0].iter == 3 and len(states[0].accordion_stats()["bytes_per_step"]) == 3
    for p, q in zip(*map(local_shards, models)):
        assert torch.equal(p, q), float((p - q).abs().max())


@functools.lru_cache(maxsize=None)
def one_replica_of_four_shards():
    return init_device_mesh("cpu", (1, 4), mesh_dim_names=("replicate", "shard"))


def check_an_fp16_reduction_that_divides_after_the_hook_gets_its_factor_back():
    """fp16 reduced in fp16 over 4 shards: FSDP divides by 2 before its reduce-scatter and by 2
    after the hook; the hook sees the mean (the buffer / 2) and writes back × 2. Each gradient
    equals plain FSDP's (no hook, the same mesh) to within 2⁻²⁴: halving the buffer is exact but
    for an fp16 subnormal, which loses at most half its ulp (2⁻²⁵) and gets it back doubled."""
    policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float16)
    grads = []
    for hooked_state in (True, False):
        model = sharded(make_model(), one_replica_of_four_shards()["shard"], mp_policy=policy)
        if hooked_state:
            state = AccordionState(one_replica_of_four_shards(), Compression.none, model=model, window_steps=2)
            assert state._layout.units[0].post_divide(torch.zeros(1, dtype=torch.float16)) == 2.0
        x, y = batch(0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append([p.grad.to_local().clone() for p in model.parameters()])
    worst = max(float((a.double() - b.double()).abs().max()) for a, b in zip(*grads) if a.numel())
    assert worst <= 2.0 ** -24, worst
    return worst


def check_end_epoch_before_any_step_warns_as_on_ddp():
    """Issue 43: the same call was a silent no-op on FSDP; it now says what DDP's state says."""
    import warnings

    from horovod_accordion.core.exchange import END_EPOCH_BEFORE_ANY_STEP

    model, optimizer, state = hooked(PowerSGD(2, 1, min_compression_rate=0), window_steps=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.end_epoch()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert messages == [END_EPOCH_BEFORE_ANY_STEP], messages
    train(model, optimizer, 2)
    assert state._exchange.accordion.detector.windows_seen == 0  # the early call closed none
    state.end_epoch()
    assert state._exchange.accordion.detector.windows_seen == 1
    return messages[0]


def check_grad_scaler_under_an_fp16_policy_skips_an_overflow_on_every_rank_and_rank_0_says_so():
    """Issue 43: a ``GradScaler("cpu")`` given as ``grad_scaler=`` under an fp16
    ``MixedPrecisionPolicy``. Rank 1 alone overflows at step 3: every rank skips that step (its
    parameters stay as they were), every scaler halves its scale, the replicas stay alike, and the
    overflow warning comes once, from rank 0, in FSDP's words."""
    return overflow_under_a_grad_scaler("accordion")


def check_a_policy_without_checks_says_so_too():
    """The phase schedule reads no norms, so no window is a check: the overflow warning, which
    the sharded path gives at a check, never came."""
    return overflow_under_a_grad_scaler(PhaseSchedule(total_windows=3))


def overflow_under_a_grad_scaler(policy):
    import warnings

    model = sharded(make_model(), mesh()["shard"],
                    mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1000)
    state = AccordionState(mesh(), PowerSGD(2, 1, min_compression_rate=0), model=model, optimizer=optimizer,
                           grad_scaler=scaler, window_steps=2, interval=1, policy=policy)
    overflow_at, scales, skipped = 3, [], None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            optimizer.zero_grad()
            before = local_shards(model)
            x, y = batch(step)
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            if step == overflow_at and dist.get_rank() == 1:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step == overflow_at:
                skipped = all(torch.equal(a, b) for a, b in zip(before, local_shards(model)))
            scales.append(scaler.get_scale())
    assert skipped, "the overflow step changed this rank's parameters"
    assert scales == [2.0 ** 10] * overflow_at + [2.0 ** 9] * (6 - overflow_at), scales
    assert all(s == scales for s in every_rank(scales))
    shards = every_rank(local_shards(model))
    for s in range(SHARDS):  # replica r's shard s is on rank r·SHARDS + s
        assert all(torch.equal(a, b) for a, b in zip(shards[s], shards[SHARDS + s])), s
    overflow = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    if dist.get_rank() == 0:
        assert len(overflow) == 1 and "FSDP's own all-reduce" in overflow[0] and "Horovod" not in overflow[0], overflow
    else:
        assert overflow == [], overflow
    return {"scales": scales, "warning": overflow}


def check_errors_say_frozen_and_name_the_layers_shapes():
    """Issue 43: a parameter frozen on one rank only was reported as a mismatch of positions, and
    under FSDP a layer's shape as its shard's."""
    said = {}
    for change, expected in (("freeze", "frozen (requires_grad=False) on some ranks only"),
                             ("reshape", "(16, 12)")):
        model = make_model()
        if dist.get_rank() == 3:
            if change == "freeze":
                model[2].bias.requires_grad_(False)
            else:
                model[0] = torch.nn.Linear(12, 18)
        model = sharded(model, mesh()["shard"])
        try:
            AccordionState(mesh(), PowerSGD(2, 1), model=model)
        except ValueError as error:
            said[change] = str(error)
        else:
            raise AssertionError(f"not refused: {change}")
        if dist.get_rank() == 3:
            assert expected in said[change], said[change]
            if change == "reshape":
                assert "(18, 12)" in said[change] and "(8, 12)" not in said[change], said[change]
    return said
