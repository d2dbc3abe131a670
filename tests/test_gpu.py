"""The worker checks on GPU tensors: ``make test-gpu``.

The torch and TF checks run through Horovod's NCCL on two GPUs; the DDP hook's and
Lightning's need one GPU and no Horovod. Skipped in ``make test`` (CPU only). Under ``make
test-gpu`` they skip, with the reason, on a machine without a CUDA GPU, with one GPU where
two are needed, or with a Horovod built without NCCL (see docker/Dockerfile.gpu).
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import check_names, worker_env


TWO_GPUS_AND_NCCL = ("import torch, horovod.torch as h; "
                     "print('no CUDA GPU visible to torch' if not torch.cuda.is_available() else "
                     "'only one GPU: the checks need two ranks' if torch.cuda.device_count() < 2 else "
                     "'' if h.nccl_built() else 'Horovod was built without NCCL: HOROVOD_GPU_OPERATIONS=NCCL make setup')")
ONE_GPU = "import torch; print('' if torch.cuda.is_available() else 'no CUDA GPU visible to torch')"


def skip_unless_ready(probe):
    """Skip, saying why, outside ``make test-gpu`` or where ``probe`` prints a reason; the probe
    runs in a subprocess, so that pytest itself never initialises CUDA."""
    if os.environ.get("HOROVOD_ACCORDION_GPU_TESTS") != "1":
        pytest.skip("GPU tests run with `make test-gpu`")
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=worker_env())
    reason = answer.stdout.strip() or (answer.stderr.strip()[-300:] if answer.returncode else None)
    if reason:
        pytest.skip(f"make test-gpu: {reason}")


@pytest.fixture(scope="module")
def gpu():
    skip_unless_ready(TWO_GPUS_AND_NCCL)


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
@pytest.mark.parametrize("module", ["gpu_checks", "tf_gpu_checks"])
def test_every_compression_on_gpu_matches_the_cpu(gpu, launches, module, controller):
    launches(module, controller).check("check_every_compression_on_the_device_matches_the_cpu")


@pytest.fixture(scope="module")
def one_gpu():
    skip_unless_ready(ONE_GPU)


@pytest.mark.multiworker
@pytest.mark.parametrize("backend, np", [("nccl", 1), ("gloo", 2)])
@pytest.mark.parametrize("check", check_names("ddp_gpu_checks"))
def test_the_ddp_hook_on_gpu(one_gpu, launches, backend, np, check):
    launches("ddp_gpu_checks", "torchrun", np=np, env={"ACCORDION_DDP_BACKEND": backend}).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("lightning_gpu_checks"))
def test_lightning_on_gpu(one_gpu, launches, check):
    pytest.importorskip("lightning")
    launches("lightning_gpu_checks", "torchrun", np=1).check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("fsdp_gpu_checks"))
def test_fsdp_on_one_gpu(one_gpu, launches, check):
    launches("fsdp_gpu_checks", "torchrun", np=1).check(check)


# TF's CUDA 12 build beside torch's CUDA 13 NCCL and cuDNN (the GPU image's layout, docs/horovod-build.md):
# a float64 convolution, whose cuDNN and CPU results differ only by the order of 27 products'
# sums: |error| <= 27 · 2^-52 · Σ|x·w| < 27 · 2^-52 · 27 · 6 · 6 < 1e-11 (|x|, |w| < 6 for these draws).
TF_CONVOLUTION = """
import numpy as np, tensorflow as tf, horovod.tensorflow as hvd
assert tf.config.list_physical_devices("GPU"), "TensorFlow sees no GPU"
x, w = (np.random.default_rng(seed).standard_normal(shape) for seed, shape in ((0, (2, 16, 16, 3)), (1, (3, 3, 3, 4))))
assert np.abs(x).max() < 6 and np.abs(w).max() < 6
with tf.device("/GPU:0"):
    on_gpu = tf.nn.conv2d(x, w, 1, "SAME")
assert on_gpu.device.endswith("GPU:0"), on_gpu.device
gpu = on_gpu.numpy()
with tf.device("/CPU:0"):
    cpu = tf.nn.conv2d(x, w, 1, "SAME").numpy()
np.testing.assert_allclose(gpu, cpu, rtol=0, atol=1e-11)
print("TF convolved on", tf.config.list_physical_devices("GPU")[0].name, "with Horovod", hvd.nccl_built())
"""


def test_tensorflow_convolves_on_the_gpu_with_the_environments_cudnn_and_nccl(one_gpu):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("make test-gpu: no TensorFlow in this environment")
    # The bound above holds for cuDNN's GEMM-style algorithms, which sum the same 27 products in another order.
    # Autotuning off, TF takes cuDNN's heuristic choice instead of timing FFT ones too (not yet run on a device).
    result = subprocess.run([sys.executable, "-c", TF_CONVOLUTION], capture_output=True, text=True, timeout=300,
                            env=worker_env({"TF_CUDNN_USE_AUTOTUNE": "0"}))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
