"""A ``hvd.elastic.run`` training job for ``tests/test_fault_tolerance.py``.

Adaptive PowerSGD with ``verify_levels``, a commit every 2 steps, the learning rate a quarter
from step 30 (a decay the ranks must agree on, ``core.rates``). Rank 1 kills itself (SIGKILL)
inside the backward of the step after the commit of step 12, once in the whole job, after the
later layers' buckets, and the rate they carry, went on the wire; its host comes back after
Horovod's blacklist cooldown and a new worker joins. Every worker appends what it
did to ``DIR/worker.<pid>.jsonl``: each step's world, levels and error-feedback memory
norm, each commit, each reset, and the final weights; ``keras_elastic_job.py`` is its twin.
"""
import json
import os
import signal
import sys
import time

import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import Compression
from tests.workers.torch_checks import make_model

TOTAL_STEPS, KILL_AFTER_STEP, DECAY_AT = 60, 12, 30


def memory_norm(optimizer):
    return float(sum(m.double().pow(2).sum() for m in optimizer._reducer.memory.values()) ** 0.5)


def main(directory):
    hvd.init()
    torch.set_num_threads(1)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.powersgd(2, 1, min_compression_rate=0),
                                         window_steps=4, interval=1, verify_levels=True)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    log = open(os.path.join(directory, f"worker.{os.getpid()}.jsonl"), "a", buffering=1)

    def write(**record):
        log.write(json.dumps(record) + "\n")

    state.register_reset_callbacks([lambda: write(event="reset", size=hvd.size(), rank=hvd.rank())])
    killed = os.path.join(directory, "killed")

    def die_in_backward(grad):
        """The first layer's gradient comes last in backward: every other bucket has started."""
        if hvd.rank() == 1 and state.step == KILL_AFTER_STEP and not os.path.exists(killed):
            open(killed, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return grad
    model[0].weight.register_hook(die_in_backward)

    @hvd.elastic.run
    def train(state):
        while state.step < TOTAL_STEPS:
            generator = torch.Generator().manual_seed(1000 * hvd.rank() + state.step)
            x, y = torch.randn(16, 20, generator=generator), torch.randint(0, 4, (16,), generator=generator)
            before = memory_norm(optimizer)
            for group in optimizer.param_groups:
                group["lr"] = 0.05 if state.step < DECAY_AT else 0.0125
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            write(event="batch", step=state.step, rank=hvd.rank(), size=hvd.size(), memory_norm_before=before,
                  accordion_step=optimizer._accordion.step, levels=list(optimizer.accordion_stats()["levels"].values()))
            state.step += 1
            if state.step % 2 == 0:
                state.commit()
                write(event="commit", step=state.step, accordion_step=optimizer._accordion.step,
                      memory_norm=memory_norm(optimizer))
            time.sleep(0.25)  # slow enough for the killed worker's host to come back mid-training

    train(state)
    write(event="done", step=state.step, rank=hvd.rank(), size=hvd.size(),
          weights=[float(p.detach().double().sum()) for p in model.parameters()])


if __name__ == "__main__":
    main(sys.argv[1])
