"""The adapters meeting their users' code on 2 real Horovod processes, torch and TF, over Gloo
and over MPI (``tests/workers/usage_checks.py``), and the learning rate agreed over the ranks
(``lr_agreement_checks.py``): one launch per controller."""
import pytest

from tests.conftest import CONTROLLERS, check_names

LAUNCH = "usage_checks+lr_agreement_checks"


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names(LAUNCH))
def test_usage(launches, controller, check):
    launches(LAUNCH, controller).check(check)
