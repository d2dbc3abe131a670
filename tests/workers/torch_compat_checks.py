"""Horovod's own behaviours on our torch drop-in, used the way Horovod 0.28.1's
``test/parallel/test_torch.py`` uses them, on 2 real ranks: an optimizer of a process set this
rank is not in, sparse embeddings with ``Compression.none``, broadcasting an empty optimizer
state, and Horovod's private names."""
import torch
import horovod.torch as horovod

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression


def setup():
    hvd.init()  # with HOROVOD_DYNAMIC_PROCESS_SETS=1, as Horovod's tests add their sets
    torch.set_num_threads(1)
    return hvd.rank()


def check_an_optimizer_of_a_process_set_this_rank_is_not_in_trains_without_a_hang():
    """Horovod allows it and skips the non-members in ``synchronize()``; ours raised at
    construction on rank 1, which went on to the next collective while rank 0 waited: a hang."""
    evens = hvd.add_process_set([0])
    for compression in (Compression.none, Compression.powersgd(2, 1, min_compression_rate=0)):
        torch.manual_seed(hvd.rank())
        model = torch.nn.Sequential(torch.nn.Linear(100, 10), torch.nn.ReLU(), torch.nn.Linear(10, 10))
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                                             named_parameters=model.named_parameters(), process_set=evens,
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        x, y = torch.randn(64, 100), torch.randn(64, 10)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        # The member counts its step; the non-member applied its own gradients, as Horovod's does.
        assert optimizer.accordion_stats()["steps"] == (1 if hvd.rank() == 0 else 0)
    horovod.barrier()
    hvd.remove_process_set(evens)


class Embedded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 3, sparse=True)

    def forward(self, x):
        return self.embedding(x)


def check_sparse_embeddings_go_horovods_sparse_way_with_none_and_fp16():
    """``SparseAdam`` with ``sparse_as_dense=False`` (Horovod's default) and with ``True``: the
    applied update equals Horovod's own optimizer's on the same data, and the ranks agree."""
    for sparse_as_dense in (False, True):
        for compression in (Compression.none, Compression.fp16):
            runs = []
            # Horovod's sparse path ignores the compression, and its fp16 decompress fails there.
            reference = compression if sparse_as_dense else Compression.none
            for wrap, kind in ((hvd.DistributedOptimizer, compression), (horovod.DistributedOptimizer, reference)):
                torch.manual_seed(0)
                model = Embedded()
                inputs = torch.LongTensor([[1, 2, 4, 5], [4, 3, 2, 9]] if hvd.rank() == 0 else [[1, 3, 4], [4, 7, 9]])
                optimizer = wrap(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                 sparse_as_dense=sparse_as_dense, compression=kind)
                for _ in range(2):
                    optimizer.zero_grad()
                    model(inputs).sum().backward()
                    optimizer.step()
                runs.append(model.embedding.weight.detach().clone())
            assert torch.equal(runs[0], runs[1]), (sparse_as_dense, compression, (runs[0] - runs[1]).abs().max())
            rows = horovod.allgather(runs[0].reshape(1, -1), name="compat.embedding")
            assert torch.equal(rows[0], rows[1])
    model = Embedded()
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                         compression=Compression.topk(0.5, 0.1))
    try:
        model(torch.LongTensor([[1, 2]])).sum().backward()
        optimizer.step()
    except ValueError as error:
        assert "sparse_as_dense=True" in str(error), error
    else:
        raise AssertionError("a compressing level took a sparse gradient")


class NoGrad(torch.nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.a = torch.nn.Parameter(a.int(), requires_grad=False)
        self.b = torch.nn.Parameter(b)

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


def check_broadcasting_an_empty_optimizer_state_initializes_it_as_horovod_does():
    """Horovod zeroes the gradients and runs the wrapped optimizer's own step, so that the state
    exists to broadcast: the same here, for every compression, without an exchange step (no
    Accordion step counted, no byte sent, the compression state untouched)."""
    for compression in (Compression.none, Compression.powersgd(2, 1, min_compression_rate=0),
                        Compression.topk(0.5, 0.1)):
        model = NoGrad(torch.Tensor([1, 3]), torch.rand(4))
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True),
            named_parameters=model.named_parameters(), compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        grad = optimizer.param_groups[0]["params"][1].grad
        assert optimizer.param_groups[0]["params"][0].grad is None
        assert torch.equal(grad, horovod.broadcast(grad, root_rank=0, name="compat.grad"))
        assert "momentum_buffer" in optimizer.state[model.b]
        stats = optimizer.accordion_stats()
        assert stats["steps"] == 0 and stats["total_bytes_sent"] == 0, stats
    # A matrix, so that PowerSGD keeps a memory: the initialization leaves it at zero.
    model = torch.nn.Linear(8, 8)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0))
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert "exp_avg" in optimizer.state[model.weight]
    assert not optimizer._reducer.memory[0].any() and optimizer.accordion_stats()["steps"] == 0


def check_optimizer_parameter_names_are_horovods():
    """``_parameter_names``, as Horovod's test reads it: every parameter named, the same on every rank."""
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.001))
    names = optimizer._parameter_names
    assert len(names) == len(set(names.values())) == 4
    gathered = horovod.allgather_object(set(names.values()))
    assert gathered[0] == gathered[1]
    named = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                     named_parameters=model.named_parameters())
    assert named._parameter_names == {p: name for name, p in model.named_parameters()}


def check_horovods_private_names_resolve():
    for name in ("_check_has_gpu", "_MPI_LIB_AVAILABLE"):
        assert getattr(hvd, name) is getattr(horovod, name), name
