"""The installed stack is real: Horovod was built with both frameworks and both controllers."""
import subprocess
import sys
import pathlib


def test_check_build_lists_frameworks_and_controllers():
    horovodrun = pathlib.Path(sys.executable).parent / "horovodrun"
    output = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True,
                            check=True, timeout=120).stdout
    for feature in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {feature}" in output, output
