"""A plain ``horovodrun -np 2`` job whose rank 1 is killed (SIGKILL) in the middle of
training, used by ``tests/test_fault_tolerance.py``: rank 0 must not hang in its next
collective. Rank 1 writes the time of its death to ``DIR/killed_at``; rank 0 writes
``DIR/finished`` only if training ended normally, which it must not."""
import os
import signal
import sys
import time

import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.torch_checks import make_model, train

if __name__ == "__main__":
    directory = sys.argv[1]
    hvd.init()
    torch.set_num_threads(1)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1), window_steps=2)
    train(model, optimizer, 3)
    if hvd.rank() == 1:
        with open(os.path.join(directory, "killed_at"), "w") as stream:
            stream.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    train(model, optimizer, 1000)
    with open(os.path.join(directory, "finished"), "w") as stream:
        stream.write("rank 0 went on alone")
