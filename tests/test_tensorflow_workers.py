"""TensorFlow and tf_keras adapters on 2 real Horovod processes, over Gloo and over MPI: the two
worker modules share one launch per controller."""
import pytest

from tests.conftest import CONTROLLERS, check_names

LAUNCH = "tf_checks+keras_baseline_checks"
TIMEOUT = 600  # the baselines' twelve Keras fits are each traced anew


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("tf_checks"))
def test_tensorflow(launches, controller, check):
    launches(LAUNCH, controller, timeout=TIMEOUT).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("keras_baseline_checks"))
def test_keras_baselines(launches, controller, check):
    launches(LAUNCH, controller, timeout=TIMEOUT).check(check)
