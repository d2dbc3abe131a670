"""TensorFlow and tf_keras adapters on 2 real Horovod processes, over Gloo and over MPI."""
import pytest

from tests.conftest import CONTROLLERS, check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("tf_checks"))
def test_tensorflow(launches, controller, check):
    launches("tf_checks", controller).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("keras_baseline_checks"))
def test_keras_baselines(launches, controller, check):
    # twelve Keras fits, each traced anew: about 90 s on Gloo, more under MPI's slower start
    launches("keras_baseline_checks", controller, timeout=600).check(check)
