"""TensorFlow and tf_keras adapters, and Horovod's own TensorFlow stack, on 2 real Horovod processes,
over Gloo and over MPI: the three worker modules share one launch per controller."""
import pytest

from tests.conftest import CONTROLLERS, check_names

# Horovod's own checks first, in a clean process: a hang in ours must not hide whether Horovod works.
LAUNCH = "tf_smoke_checks+tf_checks+keras_baseline_checks"
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


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("tf_smoke_checks"))
def test_tensorflow_stack(launches, controller, check):
    launches(LAUNCH, controller, timeout=TIMEOUT).check(check)
