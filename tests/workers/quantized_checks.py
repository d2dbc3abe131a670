"""``Quantized``'s two-shot exchange on real processes, against the float64 reference
(``tests/quantized_reference.py``): the core reducer over a backend's real collectives.

``check_two_shot_matches_the_float64_reference`` runs in the Horovod torch launches (Gloo and
MPI, 2 ranks, through ``torch_checks``), in the DDP launch (2 ranks) and in this module's own
``torchrun`` launch of 3 ranks, where the chunks are uneven in the layers they hold.
"""
import math

import numpy as np
import torch
import torch.distributed as dist

from horovod_accordion.core.compression import Quantized, padded_length, quantized_bytes
from horovod_accordion.core.reducers import QuantizedReducer
from tests.quantized_reference import TwoShot

SHAPES = [(7,), (5, 13), (64,), (3, 3, 4), (130,)]
# Level switches 8 → 4 → 2 → 8, then the layers of one bucket at three levels at once.
BITS = [[8] * 5] * 3 + [[4] * 5] * 3 + [[2] * 5] * 3 + [[8] * 5] * 2 + [[8, 4, 2, 8, 4]] * 3 + [[8] * 5] * 2
BLOCK = 64


def rank_gradients(rank, step):
    """Rank ``rank``'s gradients at ``step``, fp32, each layer at its own magnitude."""
    return [(np.random.RandomState(1000 * step + 10 * rank + i).standard_normal(shape) * 10.0 ** (i - 2))
            .astype(np.float32) for i, shape in enumerate(SHAPES)]


def wire_bytes(bits, size):
    """What the two shots carry over one rank's link: 2(W − 1)/W of each level's quantized buffer."""
    total = 0
    for b in sorted(set(bits)):
        padded = sum(padded_length(math.prod(s), size, BLOCK) for s, level in zip(SHAPES, bits) if level == b)
        total += 2 * (size - 1) / size * quantized_bytes(padded, b, BLOCK)
    return round(total)


def host(value):
    """A framework's tensor or variable, on any device, as float64 numpy."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
    return np.asarray(value, dtype=np.float64)


def two_shot_matches_the_float64_reference(collectives, as_tensor=torch.from_numpy, schedule=BITS, traced=None):
    """Bit for bit at every step, outputs and both memories; the error-feedback invariant; the
    wire bytes of every step. ``as_tensor`` makes the framework's tensor of a numpy array;
    ``schedule`` is each step's bits per layer; ``traced`` wraps the reducer's ``reduce`` (TF's
    ``tf.function``). Returns the report."""
    size, rank = int(collectives.size()), int(collectives.rank())
    reducer = QuantizedReducer(SHAPES, Quantized(8, 2, ladder=(8, 4, 2)), collectives.tensors, collectives)
    reference = TwoShot([math.prod(s) for s in SHAPES], size, BLOCK)
    sum_out = [np.zeros(math.prod(s)) for s in SHAPES]
    sum_true = [np.zeros(math.prod(s)) for s in SHAPES]
    collectives.take_traffic()
    reduce = reducer.reduce if traced is None else traced(reducer.reduce)
    for step, bits in enumerate(schedule):
        reducer.set_levels(bits)
        grads = [rank_gradients(r, step) for r in range(size)]
        outputs = reduce([as_tensor(g) for g in grads[rank]])
        expected = reference.step(grads, bits)
        for i, (ours, theirs) in enumerate(zip(outputs, expected)):
            ours = host(ours).reshape(-1)
            assert np.array_equal(ours, theirs), \
                f"step {step}, layer {i}: {np.abs(ours - theirs).max():.3e} from the reference"
            assert np.array_equal(host(reducer.memory[i]), reference.memory[rank][i]), (step, i)
            assert np.array_equal(host(reducer.owner_memory[i]), reference.owner_memory[rank][i]), (step, i)
            sum_out[i] += ours
            sum_true[i] += np.mean([np.asarray(g[i], dtype=np.float64).reshape(-1) for g in grads], axis=0)
        sent = collectives.take_traffic().wire
        assert sent == wire_bytes(bits, size), (step, sent, wire_bytes(bits, size))
    # Σ out − Σ true average = −(mean of the ranks' memories + the owners' memories), up to the
    # fp32 roundings of each step, each within 2⁻²⁴ of the step's largest magnitude: M = g + e,
    # the W − 1 sums and the ÷ W of the owner's average, A + f, the two memories' differences:
    # W + 4 of them.
    bound = (size + 4) * 2.0 ** -24 * sum(reference.largest)
    worst = 0.0
    for i in range(len(SHAPES)):
        memories = np.mean([reference.memory[r][i] for r in range(size)], axis=0) + \
            np.sum([reference.owner_memory[r][i] for r in range(size)], axis=0)
        gap = np.abs(sum_out[i] - sum_true[i] + memories).max()
        assert gap <= bound, (i, gap, bound)
        worst = max(worst, float(gap))
    return {"ranks": size, "steps": len(schedule), "invariant gap": worst, "its bound": bound}


def setup():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    return dist.get_rank()


def check_two_shot_matches_the_float64_reference():
    from horovod_accordion.hooks.ops import DistributedCollectives
    from horovod_accordion.torch_common.tensors import TorchTensorOps
    return two_shot_matches_the_float64_reference(DistributedCollectives(TorchTensorOps()))
