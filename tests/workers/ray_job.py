"""Ray Train with Accordion, as a driver: a local Ray cluster of 2 CPUs, ``TorchTrainer`` with
2 workers (Gloo). Run by ``tests/test_ray_train.py``; prints one ``RESULT {json}`` line.

1. 14 steps (7 epochs of 2) with PowerSGD 2/1, inputs ×10 from step 6 and the LR a quarter
   from step 10; each worker then runs the plain DDP hook on the same steps and data in the
   same process group and checks the parameters are bitwise equal, and equal on both ranks.
   A checkpoint is reported after epoch 3.
2. A new ``TorchTrainer`` (new worker processes) starts from that checkpoint and must end
   bitwise where run 1 ended (sha256 of the parameters' bytes), with the same checks.
"""
import hashlib
import json
import pathlib
import sys
import tempfile

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

EPOCHS, STEPS_PER_EPOCH, DECAY_STEP, CHECKPOINT_EPOCH = 7, 2, 10, 3


def train_loop_per_worker(config):
    from horovod_accordion.ddp import AccordionState, PowerSGD
    from horovod_accordion.ray_train import prepare_accordion, report
    from tests.workers.ddp_checks import (assert_same_parameters_on_all_ranks, hooked_with_epoch_windows,
                                          levels_history, loss_at)
    from tests.workers.models import make_model

    torch.set_num_threads(1)
    compression = PowerSGD(2, 1, min_compression_rate=0)
    model = ray.train.torch.prepare_model(make_model(seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first_epoch = 0
    checkpoint = config["resume_from"] and ray.train.Checkpoint(config["resume_from"])
    if checkpoint:
        with checkpoint.as_directory() as directory:
            saved = torch.load(f"{directory}/model.pt", weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first_epoch = saved["epoch"] + 1
    state = prepare_accordion(model, AccordionState(compression=compression, interval=1), optimizer, checkpoint)
    for epoch in range(first_epoch, EPOCHS):
        for step in range(STEPS_PER_EPOCH * epoch, STEPS_PER_EPOCH * (epoch + 1)):
            if step == DECAY_STEP:
                optimizer.param_groups[0]["lr"] /= 4
            optimizer.zero_grad()
            loss = loss_at(model, step)
            loss.backward()
            optimizer.step()
        state.end_epoch()
        if epoch + 1 == CHECKPOINT_EPOCH:
            with tempfile.TemporaryDirectory() as directory:
                if ray.train.get_context().get_world_rank() == 0:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "epoch": epoch}, f"{directory}/model.pt")
                report(state, {"epoch": epoch, "loss": loss.item()}, checkpoint_dir=directory)
        else:
            report(state, {"epoch": epoch, "loss": loss.item()})

    assert_same_parameters_on_all_ranks(model.module)
    history = levels_history(state.accordion_stats())
    if config["compare"]:
        plain, plain_state = hooked_with_epoch_windows(compression, EPOCHS, STEPS_PER_EPOCH, DECAY_STEP)
        for (name, p), q in zip(model.module.named_parameters(), plain.parameters()):
            assert torch.equal(p, q), f"{name}: max diff {(p - q).abs().max():.3e}"
        assert history == levels_history(plain_state.accordion_stats())
        seen = [set(levels.values()) for _, _, levels in history]
        assert {2} in seen and {1} in seen and any(e == "lr_decay" for e, _, _ in history), history
    summary = {"history": history, "steps": state.iter, "bytes": state.accordion_stats()["total_bytes_sent"],
               "parameters": hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                                     for p in model.module.parameters())).hexdigest()}
    # Result.metrics holds the last checkpoint's metrics only: the summary goes beside the run (local storage).
    rank = ray.train.get_context().get_world_rank()
    pathlib.Path(config["summary"].format(rank=rank)).write_text(json.dumps(summary))


def fit(storage, name, compare, resume_from=None):
    """Ray Train V2 has no ``resume_from_checkpoint``: the loop gets the checkpoint's path."""
    summary = f"{storage}/{name}-rank{{rank}}.json"
    trainer = TorchTrainer(train_loop_per_worker,
                           train_loop_config={"compare": compare, "resume_from": resume_from, "summary": summary},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=storage, name=name))
    result = trainer.fit()
    return result, [json.loads(pathlib.Path(summary.format(rank=rank)).read_text()) for rank in range(2)]


def main(storage, address=None):
    """``address``: a running cluster's (the tests share one); by default, a local one of 2 CPUs."""
    ray.init(address=address, num_cpus=None if address else 2, include_dashboard=False)
    uninterrupted, firsts = fit(storage, "uninterrupted", compare=True)
    [checkpoint] = [c for c, m in uninterrupted.best_checkpoints if m.get("epoch") == CHECKPOINT_EPOCH - 1]
    _, seconds = fit(storage, "resumed", compare=False, resume_from=checkpoint.path)
    for first, second in zip(firsts, seconds):
        assert first["parameters"] == second["parameters"], "the resumed run ends elsewhere (sha256 of the parameters)"
        assert first["history"] == second["history"]
    first = firsts[0]
    files = sorted(p.name for p in pathlib.Path(checkpoint.path).iterdir())
    print("RESULT " + json.dumps({"steps": first["steps"], "checks": len(first["history"]),
                                  "bytes_rank0": first["bytes"], "checkpoint_files": files}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
