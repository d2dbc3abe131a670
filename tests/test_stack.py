"""The installed stack is real: Horovod was built with both frameworks and both controllers."""
import subprocess
import sys
import pathlib

import pytest

from tests.conftest import CONTROLLERS, check_names


def test_check_build_lists_frameworks_and_controllers():
    horovodrun = pathlib.Path(sys.executable).parent / "horovodrun"
    output = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True,
                            check=True, timeout=120).stdout
    for feature in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {feature}" in output, output


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("check", check_names("tf_smoke_checks"))
def test_tensorflow_stack(launches, controller, check):
    launches("tf_smoke_checks", controller).check(check)
