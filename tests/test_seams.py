"""Issue 18's seam bugs, each on 2 real Horovod processes, over Gloo and over MPI."""
import pytest

from tests.conftest import CONTROLLERS, check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("seam_checks"))
def test_seams(launches, controller, check):
    launches("seam_checks", controller).check(check)
