"""Keras 3 (TensorFlow 2.21's default Keras) on 2 real Horovod processes, over Gloo and MPI,
as a user runs it: without TF_USE_LEGACY_KERAS."""
import pytest

from tests.conftest import CONTROLLERS, check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("keras3_checks"))
def test_keras3(launches, controller, check):
    launches("keras3_checks", controller, env={"TF_USE_LEGACY_KERAS": ""}).check(check)
