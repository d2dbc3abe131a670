"""Accordion on torch DDP, without Horovod: the demo MLP on the embedded digits dataset.

    torchrun --nproc_per_node 2 examples/ddp_accordion.py --plots ddp-plots

The model is wrapped in ``DistributedDataParallel`` as usual; one call registers
Accordion's communication hook. PowerSGD runs at rank 2 (ℓ_low) in critical regimes and
rank 1 (ℓ_high) elsewhere; each check prints every layer's level. ``--plots DIR`` draws the
run's norms and levels from its log (``python -m horovod_accordion.tools.plot`` does the same).
"""
import os
import pathlib
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.ddp import AccordionState, accordion_hook
from horovod_accordion.examples.ddp_loop import COMPRESSIONS, argument_parser
from horovod_accordion.examples.runs import announce, say
from example_data import digits_shards
from progress import train_with_epoch_windows


def parse_args():
    parser = argument_parser(__doc__)
    parser.add_argument("--plots", metavar="DIR", help="rank 0 draws the run's norms and levels here (with several "
                        "compressions, each run's in DIR/<compression>)")
    return parser.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    for compression in args.compression:
        plots = args.plots and (args.plots if len(args.compression) == 1 else os.path.join(args.plots, compression))
        train(args, compression, plots)
    dist.destroy_process_group()


def train(args, compression, plots):
    rank, size = dist.get_rank(), dist.get_world_size()
    announce(rank, compression)
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in digits_shards(rank, size))
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.decay_epoch, gamma=0.1)
    log_path = pathlib.Path(tempfile.mkdtemp()) / "accordion.jsonl" if plots and rank == 0 else None
    state = AccordionState(compression=COMPRESSIONS[compression], model=model, optimizer=optimizer,
                           interval=args.interval, log_path=log_path)
    model.register_comm_hook(state, accordion_hook)

    accuracy = train_with_epoch_windows(state, model, optimizer, scheduler, (x_train, y_train, x_test, y_test),
                                        args, rank, "ddp")
    if rank == 0:
        sent = state.accordion_stats()["total_bytes_sent"] / 1e3
        say(f"[rank 0] {compression}: test accuracy {accuracy:.3f}, {sent:.1f} kB sent per rank")
        if log_path is not None:
            from horovod_accordion.tools.plot import run_figures
            for path in run_figures(log_path, plots):
                say(f"[rank 0] wrote {path}")


if __name__ == "__main__":
    main()
