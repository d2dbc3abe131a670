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
