"""PowerSGD's per-bucket P and Q buffers (``TorchTensorOps.pack_products``) on one rank: what a
collective may give back, which tensors share the buffer, and gradients with a history. The
workers' ``check_powersgd_computes_p_and_q_into_buffers_kept_across_steps`` runs them on 2 ranks."""

import types
import warnings

import pytest
import torch
from torch.profiler import profile

from horovod_accordion.core.compression import PowerSGD, TopK
from horovod_accordion.core.reducers import PowerSGDReducer, make_reducer

from tests.test_policies import LoneRank, lone_backends

SHAPES = [(64, 32, 3, 3), (64,), (10, 64), (5,), (128, 64)]


def gradients(seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES]


def reducer_on(collectives_class=LoneRank, rank=2):
    tensors, _ = lone_backends()
    return PowerSGDReducer(SHAPES, PowerSGD(rank, min_compression_rate=0), tensors, collectives_class(tensors))


class CopyingLoneRank(LoneRank):
    """A collective that gives back a new tensor, not the one it was handed."""

    def start_allreduce_mean(self, flat, name, compression=None):
        return types.SimpleNamespace(wait=lambda: flat.clone())


def test_a_collective_that_returns_a_copy_gives_the_same_averages_as_one_that_averages_in_place():
    """On the CPU, P and Q lie transposed in their buffer: a copy read back row by row scrambled them."""
    in_place, copying = reducer_on(), reducer_on(CopyingLoneRank)
    for step in range(3):
        for ours, theirs in zip(in_place.reduce(gradients(step)), copying.reduce(gradients(step))):
            assert torch.equal(ours, theirs), step


def test_bf16_one_dimensional_gradients_travel_in_the_buffer_without_a_cat():
    """Their wire dtype is fp32, the buffer's: they left the products' group to a cat."""
    reducer = reducer_on()
    grads = [g if g.dim() > 1 else g.to(torch.bfloat16) for g in gradients()]
    reducer.reduce(grads)
    with profile() as step:
        outputs = reducer.reduce(grads)
    assert [event.name for event in step.events() if event.name == "aten::cat"] == []
    assert [o.dtype for o in outputs] == [g.dtype for g in grads]
    for layer in (1, 3):  # one rank: an uncompressed tensor's average is itself
        assert torch.equal(outputs[layer], grads[layer])


def test_gradients_with_a_history_are_reduced():
    """``loss.backward(create_graph=True)`` leaves gradients that require grad; ``matmul(out=)`` refuses those."""
    reducer = reducer_on()
    weights = [torch.ones(shape, requires_grad=True) for shape in SHAPES]
    outputs = reducer.reduce([g * w for g, w in zip(gradients(), weights)])
    assert all(torch.isfinite(o).all() for o in outputs)


def test_a_compression_that_leaves_every_layer_whole_says_so_and_names_the_largest():
    """``PowerSGD(64, 32)`` on layers smaller than its rank sent everything uncompressed with empty levels, silently."""
    tensors, collectives = lone_backends()
    small = [(32, 16), (16,), (8, 32)]
    with pytest.warns(RuntimeWarning, match=r"PowerSGD\(low_rank=64.*compresses none of the 3 gradients.*"
                                            r"largest is of shape \(32, 16\)"):
        reducer, _ = make_reducer(PowerSGD(64, 32), small, tensors, collectives, None)
    assert reducer.compressed == []
    with pytest.warns(RuntimeWarning, match=r"TopK.*compresses none of the 2 gradients.*largest is of shape \(16,\)"):
        make_reducer(TopK(0.5, 0.1), [(16,), (4,)], tensors, collectives, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert make_reducer(PowerSGD(2, 1), small, tensors, collectives, None)[0].compressed == [0, 2]
