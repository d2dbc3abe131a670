"""Keras 3 breaks Horovod's Keras integration: the user is told what to set."""
import os
import subprocess
import sys

from tests.conftest import REPO


def run_python(code, legacy_keras):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update({"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"})
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


def test_importing_keras_adapter_without_legacy_flag_says_what_to_set():
    result = run_python("import horovod_accordion.keras", legacy_keras=False)
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "TF_USE_LEGACY_KERAS=1" in result.stderr, result.stderr[-2000:]


def test_a_keras3_optimizer_is_rejected_with_the_fix():
    code = ("import keras\n"
            "from horovod_accordion.tensorflow import DistributedOptimizer, Compression\n"
            "try:\n"
            "    DistributedOptimizer(keras.optimizers.SGD(0.1), compression=Compression.topk(0.5))\n"
            "except ValueError as error:\n"
            "    print('REJECTED', error)\n")
    result = run_python(code, legacy_keras=True)
    assert "REJECTED" in result.stdout and "TF_USE_LEGACY_KERAS=1" in result.stdout, result.stdout + result.stderr
