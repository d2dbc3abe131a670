"""Mixed precision, bf16, ``create_graph`` and ``torch.compile`` on real worker processes: the
Horovod torch optimizer on 2 ranks (Gloo and MPI), the DDP hook under ``torchrun``."""
import pytest

from tests.conftest import CONTROLLERS, check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("torch_precision_checks"))
def test_torch_precision(launches, controller, check):
    launches("torch_precision_checks", controller).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("torch_compile_checks"))
def test_torch_compile(launches, check):
    launches("torch_compile_checks", "gloo", timeout=600).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("ddp_precision_checks"))
def test_ddp_precision(launches, check):
    launches("ddp_precision_checks", "torchrun", timeout=600).check(check)


def test_a_loss_scale_that_is_not_a_power_of_two_is_named_once():
    """Issue 45: the exchange divides the gradients by the scaler's scale, exact for powers of two
    only, and nothing said so. GradScaler's defaults are exact and say nothing; an init_scale of
    1000 is named, once per scaler, from the host settings (no device read)."""
    import warnings

    import torch

    from horovod_accordion.torch_common.loss_scale import LossScale

    def warnings_of(scaler, calls=2):
        scaler.scale(torch.ones(()))
        loss_scale = LossScale(scaler)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(calls):
                loss_scale()
        return [str(w.message) for w in caught]

    assert warnings_of(torch.amp.GradScaler("cpu")) == []
    said = warnings_of(torch.amp.GradScaler("cpu", init_scale=1000.0))
    assert len(said) == 1 and "init_scale=1000.0 is not a power of two" in said[0], said
