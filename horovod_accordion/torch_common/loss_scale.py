"""The loss scale that torch gradients carry under ``torch.amp.GradScaler``, for the exchange,
shared by the Horovod optimizer and the DDP state.

``scaler.scale(loss).backward()`` hands the gradient hooks and DDP's communication hook S ×
the true gradients. Accordion's Δ and the error-feedback state (PowerSGD's memory, TopK's
residual) must not depend on S: a scale that doubles between two checks would read as a
relative change of 1, and the memory kept at one scale would re-enter at another. So the
exchange works on the gradients × 1/S and hands back its averages × S, for the scaler's own
``unscale_``. GradScaler's scales are powers of two (its init, growth and back-off factors
are), and multiplying by a power of two is exact in floating point short of overflow and
underflow: the exchange sees the same numbers whatever S is.
"""

import gc
import math
import warnings

import torch

__all__ = ["LossScale", "grad_scaler_property"]


class LossScale:
    """The exchange's ``loss_scale``: called before a step's first bucket, it returns the scale
    the step's gradients carry, as a 0-d tensor on the scaler's device (no host sync), or
    ``None`` where there is none.

    Args:
        grad_scaler: the ``torch.amp.GradScaler`` that scales the loss, or ``None``. With
            ``None``, the first call looks for a GradScaler in use in this process (enabled, its
            ``scale()`` run) and warns, naming ``argument``, if it finds one: its gradients
            would reach Accordion in loss-scaled units. A warning, not an error: a scaler left
            from another run in the same process (a notebook) is found too.
        argument: how the user passes the scaler to this entry point, for that message.
    """

    def __init__(self, grad_scaler=None, argument="grad_scaler=scaler"):
        self.grad_scaler = grad_scaler
        self.argument = argument
        self._looked = False
        self._checked = None  # the scaler whose factors were checked

    def __call__(self):
        scaler = self.grad_scaler
        if scaler is None:
            if not self._looked:
                self._looked = True
                _warn_of_an_unseen_scaler(self.argument)
            return None
        if not scaler.is_enabled() or scaler._scale is None:
            return None
        if self._checked is not scaler:
            self._checked = scaler
            _warn_if_not_powers_of_two(scaler)
        return scaler._scale.reshape(())  # 0-d: it scales bf16 gradients without promoting them

    def __getstate__(self):
        """A scaler is the training loop's, and does not travel with a pickled state."""
        return {"grad_scaler": None, "argument": self.argument, "_looked": False}


def _warn_if_not_powers_of_two(scaler):
    """Once per scaler, from its settings on the host (no device read): the division by the scale
    is exact for powers of two only, which GradScaler's defaults are."""
    factors = {"init_scale": scaler._init_scale, "growth_factor": scaler._growth_factor,
               "backoff_factor": scaler._backoff_factor}
    odd = {name: value for name, value in factors.items() if math.frexp(value)[0] != 0.5}
    if odd:
        warnings.warn(
            f"the GradScaler's {', '.join(f'{k}={v}' for k, v in odd.items())} {'is' if len(odd) == 1 else 'are'} not "
            f"a power of two: its loss scales are not either, and the gradients × 1/scale that Accordion's detector "
            f"and error feedback see are rounded (by about one unit in the last place a step), so they depend a little "
            f"on the scale. GradScaler's defaults (65536, 2, 0.5) are exact", RuntimeWarning)


def _warn_of_an_unseen_scaler(argument):
    """Once per optimizer or state, at its first step: a scan of the live objects (``type``, not
    ``isinstance``, which would run the ``__getattr__`` of lazy modules)."""
    gc.collect()  # only the scalers still referenced
    if any(issubclass(type(o), torch.amp.GradScaler) and o.is_enabled() and o._scale is not None
           for o in gc.get_objects()):
        warnings.warn(
            f"a torch.amp.GradScaler is scaling a loss in this process, and Accordion was not given it: if it scales "
            f"these gradients, they reach the detector and the error feedback multiplied by the loss scale, and the "
            f"levels follow the scale. Pass {argument}", RuntimeWarning)


def grad_scaler_property():
    """The ``grad_scaler`` property of the torch optimizer and the DDP state, over their ``_loss_scale``."""
    def get(owner):
        return owner._loss_scale.grad_scaler

    def set_(owner, scaler):
        owner._loss_scale.grad_scaler = scaler

    return property(get, set_, doc="The ``torch.amp.GradScaler`` whose scale the gradients carry, or ``None``; "
                                   "settable.")
