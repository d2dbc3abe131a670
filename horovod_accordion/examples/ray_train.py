"""Accordion in Ray Train, on a local Ray cluster of 2 CPUs: the demo's MLP on the demo's synthetic clusters.

    python -m horovod_accordion.examples.ray_train --compression accordion

``TorchTrainer`` runs ``train_loop_per_worker`` on 2 workers (Gloo). In the loop,
``ray.train.torch.prepare_model`` wraps the model in DDP and ``prepare_accordion`` puts
Accordion's hook on it; the hook reads the learning rate from the optimizer, the loop
closes a detection window at each epoch's end, and ``report`` adds Accordion's bytes and
levels to ``ray.train.report``. ``--compression none`` and ``fp16`` are the baselines,
through the same hook with their bytes logged.
``--address auto`` joins a running cluster instead of starting one.
"""
import ray
import ray.train
import ray.train.torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

from horovod_accordion.examples.ddp_loop import argument_parser


def train_loop_per_worker(args):
    """On each worker."""
    import argparse

    import torch

    from horovod_accordion.ddp import AccordionState
    from horovod_accordion.examples.ddp_loop import COMPRESSIONS, Report, accuracy, mlp, sgd_with_step_decay, \
        shards, train_epoch
    from horovod_accordion.ray_train import prepare_accordion, report

    args = argparse.Namespace(**args)
    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = shards(rank, size)
    for compression in args.compression:
        model = ray.train.torch.prepare_model(mlp())
        optimizer, scheduler = sgd_with_step_decay(model.parameters(), args, size)
        state = prepare_accordion(model, AccordionState(compression=COMPRESSIONS[compression],
                                                        interval=args.interval), optimizer)
        epochs = Report(state, rank, compression)
        for epoch in range(args.epochs):
            losses = train_epoch(model, optimizer, x_train, y_train, args.batch_size, epoch)
            scheduler.step()
            state.end_epoch()
            test_accuracy = accuracy(model, x_test, y_test)
            report(state, {"epoch": epoch, "loss": sum(losses) / len(losses), "accuracy": test_accuracy})
            epochs.epoch(epoch, losses, test_accuracy)
        epochs.end(test_accuracy)


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--address", help="a running Ray cluster; by default, a local one of 2 CPUs")
    args = parser.parse_args()
    ray.init(address=args.address, num_cpus=None if args.address else 2, include_dashboard=False)
    TorchTrainer(train_loop_per_worker, train_loop_config=vars(args),
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()


if __name__ == "__main__":
    main()
