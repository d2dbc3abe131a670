"""PyTorch adapter on 2 real Horovod processes, over Gloo and over MPI: the checks and the overlap
checks share one launch per controller; the reliability checks, which register process sets
at ``hvd.init``, have their own."""
import pytest

from tests.conftest import CONTROLLERS, check_names

LAUNCH = "torch_checks+torch_overlap_checks"


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("torch_checks"))
def test_torch(launches, controller, check):
    launches(LAUNCH, controller).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("torch_reliability_checks"))
def test_torch_reliability(launches, controller, check):
    launches("torch_reliability_checks", controller).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("torch_overlap_checks"))
def test_torch_overlap(launches, controller, check):
    launches(LAUNCH, controller).check(check)
