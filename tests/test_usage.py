"""Issue 18's seam bugs, each on 2 real Horovod processes, over Gloo and over MPI."""
import pytest

from tests.conftest import CONTROLLERS, check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("module,check", [(m, c) for m in ("seam_checks", "review_seam_checks")
                                          for c in check_names(m)])
def test_seams(launches, controller, module, check):
    launches(module, controller).check(check)
