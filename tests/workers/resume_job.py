"""The torch phases of the cross-job resume test (``tests/test_fault_tolerance.py``), run by
``resume_jobs.py``.

``full(DIR)``: train N + M steps without stopping; at step N every rank saves its own
checkpoint (model and optimizer ``state_dict``), and at the end the final parameters.
``resume(DIR)``: a new job, started from those checkpoints,
trains the M steps and writes its parameters. The test compares the two bitwise.

Variants: adaptive PowerSGD and TopK (step windows, an LR decay after the restart), and
batch switching checkpointed two micro-batches into a large batch.
"""
import json
import os

import torch

import horovod_accordion.torch as hvd
from horovod_accordion.torch import BatchSwitch, Compression
from tests.workers.torch_checks import make_model, rank_batch

MORE_STEPS = 14
VARIANTS = {
    "powersgd": dict(compression=Compression.powersgd(2, 1, min_compression_rate=0), window_steps=3, interval=2),
    "topk": dict(compression=Compression.topk(0.5, 0.1), window_steps=3, interval=2),
    "batch": dict(batch_switch=BatchSwitch(small_batch=16, multiplier=4), window_steps=2, interval=1),
}


def build(options):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(), **options)
    return model, optimizer


def train_step(model, optimizer, step):
    for group in optimizer.param_groups:  # a decay event at step 12, after every restart point
        group["lr"] = 0.1 if step < 12 else 0.025
    x, y = rank_batch(step)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def train_to_the_restart_point(name, model, optimizer):
    """Where the first job stops: step 8, or for batch switching the first point that is two
    micro-batches into a large batch. Returns that step."""
    step = 0
    while (step < 8) if name != "batch" else not (
            optimizer.micro_batches_per_step == 4 and optimizer._steps.pending_micro_batches == 2):
        train_step(model, optimizer, step)
        step += 1
        if step > 100:
            raise RuntimeError("the large batch never came")
    return step


def full(directory):
    for name, options in VARIANTS.items():
        model, optimizer = build(options)
        start = train_to_the_restart_point(name, model, optimizer)
        torch.save({"step": start, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(directory, f"{name}.rank{hvd.rank()}.pt"))
        for step in range(start, start + MORE_STEPS):
            train_step(model, optimizer, step)
        torch.save(model.state_dict(), os.path.join(directory, f"{name}.full.rank{hvd.rank()}.pt"))
        with open(os.path.join(directory, f"{name}.checks.rank{hvd.rank()}.json"), "w") as stream:
            json.dump(optimizer.accordion_stats()["checks"], stream)


def same_checks(directory, name, checks):
    """Whether the resumed run's check history is the uninterrupted run's, before the restart included."""
    with open(os.path.join(directory, f"{name}.checks.rank{hvd.rank()}.json")) as stream:
        return json.loads(json.dumps(checks)) == json.load(stream)


def resume(directory):
    report = {}
    for name, options in VARIANTS.items():
        model, optimizer = build(options)
        saved = torch.load(os.path.join(directory, f"{name}.rank{hvd.rank()}.pt"), weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        for step in range(saved["step"], saved["step"] + MORE_STEPS):
            train_step(model, optimizer, step)
        uninterrupted = torch.load(os.path.join(directory, f"{name}.full.rank{hvd.rank()}.pt"))
        report[name] = {"stopped_at_step": saved["step"],
                        "pending_micro_batches": (saved["optimizer"]["accordion"]["micro_batches"] or {}).get("pending"),
                        "checks": len(optimizer.accordion_stats()["checks"]),
                        "same_checks_as_uninterrupted": same_checks(directory, name,
                                                                    optimizer.accordion_stats()["checks"]),
                        "bitwise_equal": all(torch.equal(p, uninterrupted[k]) for k, p in model.state_dict().items())}
    with open(os.path.join(directory, f"resume.rank{hvd.rank()}.json"), "w") as stream:
        json.dump(report, stream)

