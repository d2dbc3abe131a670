"""Ray Train with Accordion: one local Ray cluster for the module, ``TorchTrainer`` with 2 CPU
workers (Gloo); the checks of ``tests/workers/ray_job.py``, and the example with every compression."""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import REPO, free_port, Runs, worker_env

pytest.importorskip("ray.train")


def driver_env():
    """Horovod is unimportable in the drivers and in the cluster's workers."""
    return worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}", "RAY_DISABLE_USAGE_STATS": "1",
                       "RAY_DEDUP_LOGS": "0"})


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster of 2 CPUs for every driver of the module, as ``ray start --head``
    makes one; its address. Its own temp dir, where a driver started without an address does not
    look, and its own process group, stopped alone: a test beside it (the trainer pages'
    example) starts and stops its own cluster."""
    ray = str(pathlib.Path(sys.executable).parent / "ray")
    address = f"127.0.0.1:{free_port()}"
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths stay under 108 characters
    head = subprocess.Popen([ray, "start", "--head", "--block", "--temp-dir", temp_dir, "--node-ip-address",
                             "127.0.0.1", "--port", address.split(":")[1], "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            env=driver_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 180
        while subprocess.run([ray, "status", "--address", address], env=driver_env(), capture_output=True,
                             timeout=120).returncode != 0:
            assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
            time.sleep(2)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def run_driver(*args, cwd=REPO, timeout=300):
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=driver_env(), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    return result.stdout


@pytest.mark.multiworker
def test_trains_as_the_plain_ddp_hook_and_resumes_bitwise_in_new_workers(cluster, tmp_path):
    output = run_driver("-m", "tests.workers.ray_job", str(tmp_path), cluster)
    [line] = [line for line in output.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["steps"] == 14 and {"accordion-rank0.pt", "accordion-rank1.pt", "model.pt"} <= set(
        result["checkpoint_files"]), result


COMPRESSIONS = ["accordion", "none", "fp16", "rank1", "rank2", "topk", "accordion-topk"]


@pytest.fixture(scope="module")
def example(cluster):
    """The example trains every compression in turn, in one driver, on the shared cluster."""
    output = run_driver("-m", "horovod_accordion.examples.ray_train", "--address", cluster, "--epochs", "6",
                        "--decay-epoch", "4", "--compression", *COMPRESSIONS)
    return Runs(output, COMPRESSIONS)


@pytest.mark.multiworker
def test_example_trains_and_switches_levels_both_ways(example):
    output = example["accordion"]
    for rank in (0, 1):
        losses = [float(x) for x in re.findall(rf"\[rank {rank}\] epoch +\d+ +loss ([0-9.]+)",
                                                example.of_rank(rank, "accordion"))]
        assert len(losses) == 6 and losses[-1] < losses[0], output
    assert "check after epoch 0: levels per layer: 0.weight=2" in output, output
    assert re.search(r"check after epoch 2: levels per layer: .*=1", output), output
    assert "LR decay to" in output, output
    assert re.search(r"accordion: test accuracy 0\.9\d+, [0-9.]+ kB sent per rank", output), output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", COMPRESSIONS[1:])
def test_example_with_every_compression(example, compression):
    output = example[compression]
    assert f"{compression}: test accuracy" in output, output
    assert re.search(rf"{compression}: test accuracy 0\.\d+, [0-9.]+ kB sent per rank", output), output
