"""Accordion in Hugging Face Accelerate, on CPU: the demo's MLP on the demo's synthetic clusters.

    accelerate launch --multi_gpu --num_processes 2 -m horovod_accordion.examples.accelerate

(On a machine without GPUs, ``--multi_gpu`` starts the processes through torchrun and they
train over Gloo, with ``Accelerator(cpu=True)``; ``accelerate launch --cpu --num_processes 2``
starts only one process in Accelerate 1.15.) One call after ``accelerator.prepare`` registers
Accordion on the DDP model; the hook reads the learning rate from the optimizer that the
scheduler sets, and the loop closes a detection window at each epoch's end.
``--compression none`` and ``fp16`` are the baselines, through the same hook with their bytes logged.
"""
import torch
from accelerate import Accelerator

from horovod_accordion.accelerate import register_accordion
from horovod_accordion.ddp import AccordionState
from horovod_accordion.examples.ddp_loop import COMPRESSIONS, Report, accuracy, argument_parser, mlp, \
    sgd_with_step_decay, shards, train_epoch


def main():
    args = argument_parser(__doc__).parse_args()
    # Without cpu=True, a machine without GPUs runs each process alone (no DDP).
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, size = accelerator.process_index, accelerator.num_processes
    x_train, y_train, x_test, y_test = (t.to(accelerator.device) for t in shards(rank, size))
    for compression in args.compression:
        model = mlp()
        optimizer, scheduler = sgd_with_step_decay(model.parameters(), args, size)
        # Each rank keeps its own shard: the data is not prepared (Accelerate would shard it again).
        model, optimizer = accelerator.prepare(model, optimizer)
        state = register_accordion(accelerator, model, AccordionState(compression=COMPRESSIONS[compression],
                                                                      interval=args.interval), optimizer)
        report = Report(state, rank, compression)
        for epoch in range(args.epochs):
            losses = train_epoch(model, optimizer, x_train, y_train, args.batch_size, epoch, accelerator.backward)
            scheduler.step()
            state.end_epoch()
            report.epoch(epoch, losses, accuracy(model, x_test, y_test))
        report.end(accuracy(model, x_test, y_test))
    accelerator.end_training()


if __name__ == "__main__":
    main()
