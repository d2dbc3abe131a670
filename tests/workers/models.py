"""The torch workers' model and data, without Horovod: the Horovod and the DDP checks share them."""
import sys

import torch


def horovod_import_error():
    """The error that importing Horovod gives where ``tests/no_horovod`` shadows it (torchrun checks),
    after checking that no Horovod module was imported before."""
    assert not [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]
    try:
        import horovod.torch  # noqa: F401
    except ImportError as error:
        return str(error)
    raise AssertionError("horovod imported: the test's shadow package is not in front of it")


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 24), torch.nn.ReLU(), torch.nn.Linear(24, 4))


def batch_of_rank(rank, step, scale=1.0):
    """Different data on every rank, rank r's inputs (1 + 3r) times larger: the gradients
    differ, so averaging matters."""
    generator = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 20, generator=generator) * scale * (1 + 3 * rank)
    y = torch.randint(0, 4, (16,), generator=generator)
    return x, y


class Float64State:
    """Mixed into torch tensor ops: the reducer's maths and state in fp64, so that a comparison
    with numpy or with the TF reducer holds far above rounding on any CPU."""

    def state(self, array, name):
        return torch.from_numpy(array).to(torch.float64)

    def as_matrix(self, grad, shape):
        return grad.reshape(shape).to(torch.float64)


# Run B's loss scale, window by window: grows, backs off once (as after an overflow), grows again.
SCALE_PER_WINDOW = [2.0 ** 8, 2.0 ** 9, 2.0 ** 10, 2.0 ** 9, 2.0 ** 10, 2.0 ** 11]


def train_under_loss_scale(model, optimizer, scaler, rank, apply_step, varying, window_steps=5):
    """``len(SCALE_PER_WINDOW)`` windows of the AMP recipe on fp32 maths, with the scale fixed at
    2⁸ or (``varying``) moved window by window as ``SCALE_PER_WINDOW``; ``apply_step(loss)``
    runs the entry point's own recipe from ``scaler.scale(loss)`` to ``scaler.step``. Returns each
    step's unscaled averaged gradients and parameters.

    Why the two runs must agree exactly: GradScaler's scales are powers of two, and scaling by a
    power of two commutes with fp32 rounding short of overflow and underflow, so backward of
    S·loss gives exactly S × the gradients of loss, and true units give the same numbers at any S.
    Autocast's fp16 would underflow differently at each scale, so the maths here stay fp32."""
    averaged, weights = [], []
    for step in range(window_steps * len(SCALE_PER_WINDOW)):
        x, y = batch_of_rank(rank, step)
        optimizer.zero_grad()
        apply_step(torch.nn.functional.cross_entropy(model(x), y))
        averaged.append([p.grad.detach().clone() for p in model.parameters()])
        weights.append([p.detach().clone() for p in model.parameters()])
        window, last_of_window = divmod(step + 1, window_steps)
        if varying and last_of_window == 0 and window < len(SCALE_PER_WINDOW):
            scaler.update(new_scale=SCALE_PER_WINDOW[window])
        else:
            scaler.update()
    return averaged, weights


def fixed_or_varying_scaler(varying):
    """A CPU GradScaler at 2⁸ that never grows by itself (the runs move it by hand)."""
    return torch.amp.GradScaler("cpu", init_scale=SCALE_PER_WINDOW[0] if varying else 2.0 ** 8,
                                growth_interval=10 ** 9)


def assert_runs_agree(name, runs):
    """``runs``: (stats, averages, weights) of the fixed-scale run, then of the moving-scale run,
    as ``train_under_loss_scale`` gives them: equal, bitwise (its docstring says why)."""
    (fixed_stats, fixed_averages, fixed_weights), (stats, averages, weights) = runs
    assert stats == fixed_stats, (name, fixed_stats["checks"], stats["checks"])
    for step, (a, b) in enumerate(zip(averages, fixed_averages)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), (name, step)
    assert all(torch.equal(x, y) for x, y in zip(weights[-1], fixed_weights[-1])), name
