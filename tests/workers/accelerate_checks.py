"""Hugging Face Accelerate with ``register_accordion`` on 2 real CPU processes (``torchrun``,
which ``accelerate launch --multi_gpu`` runs too; Gloo), against the plain DDP hook."""
import tempfile

import torch
import torch.distributed as dist
from accelerate import Accelerator

from horovod_accordion.accelerate import register_accordion
from horovod_accordion.ddp import AccordionState, PowerSGD
from tests.workers.ddp_checks import (assert_same_parameters_on_all_ranks, every_rank, hooked_with_epoch_windows,
                                      levels_history, loss_at)
from tests.workers.models import SCALE_PER_WINDOW, fixed_or_varying_scaler, make_model

COMPRESSION = PowerSGD(2, 1, min_compression_rate=0)
EPOCHS, STEPS_PER_EPOCH, DECAY_STEP, CHECKPOINT_EPOCH = 7, 2, 10, 3


def setup():
    torch.set_num_threads(1)
    return Accelerator(cpu=True).process_index  # Accelerate starts the Gloo group


def prepared():
    accelerator = Accelerator(cpu=True)
    model = make_model(seed=0)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    state = register_accordion(accelerator, model, AccordionState(compression=COMPRESSION, interval=1), optimizer)
    return accelerator, model, optimizer, state


def train_epochs(accelerator, model, optimizer, state, epochs, first_epoch=0):
    for epoch in range(first_epoch, first_epoch + epochs):
        for step in range(STEPS_PER_EPOCH * epoch, STEPS_PER_EPOCH * (epoch + 1)):
            if step == DECAY_STEP:
                optimizer.param_groups[0]["lr"] /= 4
            optimizer.zero_grad()
            accelerator.backward(loss_at(model, step))
            optimizer.step()
        state.end_epoch()


def check_training_equals_the_plain_ddp_hook_bitwise_and_resumes_from_save_state():
    """14 steps (7 epochs of 2), inputs ×10 from step 6, the LR a quarter from step 10: the
    levels switch both ways and agree on the ranks, the parameters equal the plain DDP hook's
    bitwise. ``save_state`` after epoch 3, ``load_state`` into new objects and 4 more epochs
    end bitwise where the uninterrupted run ended."""
    accelerator, model, optimizer, state = prepared()
    assert state.bound and list(state.levels)[0] == "0.weight"
    train_epochs(accelerator, model, optimizer, state, EPOCHS)
    plain, plain_state = hooked_with_epoch_windows(COMPRESSION, EPOCHS, STEPS_PER_EPOCH, DECAY_STEP)
    for (name, p), q in zip(accelerator.unwrap_model(model).named_parameters(), plain.parameters()):
        assert torch.equal(p, q), f"{name}: max diff {(p - q).abs().max():.3e}"
    assert_same_parameters_on_all_ranks(accelerator.unwrap_model(model))
    history = levels_history(state.accordion_stats())
    assert history == levels_history(plain_state.accordion_stats())
    seen = [set(levels.values()) for _, _, levels in history]
    assert {2} in seen and {1} in seen and any(e == "lr_decay" for e, _, _ in history), history

    folder = every_rank(tempfile.mkdtemp())[0]  # rank 0's: save_state writes from the first rank
    first = prepared()
    train_epochs(*first, CHECKPOINT_EPOCH)
    first[0].save_state(folder)
    accelerator, resumed, resumed_optimizer, resumed_state = prepared()
    accelerator.load_state(folder)
    train_epochs(accelerator, resumed, resumed_optimizer, resumed_state, EPOCHS - CHECKPOINT_EPOCH,
                 first_epoch=CHECKPOINT_EPOCH)
    for (name, p), q in zip(accelerator.unwrap_model(model).named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), f"resumed, {name}: max diff {(p - q).abs().max():.3e}"
    assert levels_history(resumed_state.accordion_stats()) == history
    return {"steps": state.iter, "checks": len(history), "bytes_rank": state.accordion_stats()["total_bytes_sent"],
            "rank": dist.get_rank()}


def check_fp16_hands_the_accelerators_grad_scaler_to_the_state_and_levels_ignore_the_scale():
    """Accelerate makes a GradScaler for ``mixed_precision="fp16"`` on accelerators only; here one
    is set where Accelerate keeps its own, before ``prepare`` (fp32 maths, as the Lightning
    check explains). ``register_accordion`` hands it to the state: a run whose scale moves every
    epoch decides the levels of a run at a fixed scale, and ends at the same parameters."""
    runs = []
    for varying in (False, True):
        accelerator = Accelerator(cpu=True)
        accelerator.scaler = scaler = fixed_or_varying_scaler(varying)
        model = make_model(seed=0)
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        state = register_accordion(accelerator, model, AccordionState(compression=COMPRESSION, interval=1), optimizer)
        assert state.grad_scaler is scaler
        for epoch in range(len(SCALE_PER_WINDOW)):
            train_epochs(accelerator, model, optimizer, state, 1, first_epoch=epoch)
            if varying and epoch + 1 < len(SCALE_PER_WINDOW):
                scaler.update(new_scale=SCALE_PER_WINDOW[epoch + 1])
        runs.append((levels_history(state.accordion_stats()),
                     [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]))
    (fixed_history, fixed_weights), (history, weights) = runs
    assert history == fixed_history, (fixed_history, history)
    assert all(torch.equal(a, b) for a, b in zip(weights, fixed_weights))
