"""Accordion in Hugging Face Accelerate, on CPU: the demo MLP on the embedded digits dataset.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_accordion.py --compression accordion

(On a machine without GPUs, ``--multi_gpu`` starts the processes through torchrun and they
train over Gloo; ``accelerate launch --cpu --num_processes 2`` starts only one process in
Accelerate 1.15.) One call after ``accelerator.prepare`` registers Accordion on the DDP model;
the hook reads the learning rate from the optimizer that the scheduler sets, and the loop closes a
detection window at each epoch's end. ``--compression none`` and ``fp16`` are the
baselines, through the same hook with their bytes logged.
"""
import argparse

import numpy as np
import torch
from accelerate import Accelerator

from horovod_accordion.accelerate import register_accordion
from horovod_accordion.ddp import AccordionState
from ddp_accordion import COMPRESSIONS
from example_data import digits_shards
from progress import epochs_bar, show, write_checks


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--decay-epoch", type=int, default=10, help="the LR drops 10x here")
    parser.add_argument("--interval", type=int, default=2, help="epochs between Accordion checks")
    parser.add_argument("--compression", choices=list(COMPRESSIONS), default="accordion")
    return parser.parse_args()


def main():
    args = parse_args()
    # Without cpu=True, a machine without GPUs runs each process alone (no DDP).
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, size = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_shards(rank, size))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=args.batch_size,
                                       shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.decay_epoch, gamma=0.1)
    # Each rank keeps its own shard: the data loader is not prepared (Accelerate would shard it again).
    model, optimizer = accelerator.prepare(model, optimizer)
    state = register_accordion(accelerator, model, AccordionState(compression=COMPRESSIONS[args.compression],
                                                                  interval=args.interval), optimizer)

    checks_printed = 0
    bar = epochs_bar(args.epochs, rank, desc="accelerate")
    for epoch in bar:
        losses = []
        for x, y in data:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            losses.append(loss.item())
        scheduler.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        bar.write(f"[rank {rank}] epoch {epoch:2d}  loss {np.mean(losses):.4f}  test accuracy {accuracy:.3f}")
        state.end_epoch()
        stats = state.accordion_stats()
        show(bar, np.mean(losses), stats["total_bytes_sent"], stats["levels"])
        if rank == 0:
            write_checks(bar, stats["checks"][checks_printed:], epoch)
        checks_printed = len(stats["checks"])
    bar.close()
    if rank == 0:
        sent = state.accordion_stats()["total_bytes_sent"] / 1e3
        print(f"[rank 0] {args.compression}: test accuracy {accuracy:.3f}, {sent:.1f} kB sent per rank", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
