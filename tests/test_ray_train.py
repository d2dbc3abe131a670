"""Ray Train with Accordion: one local Ray cluster for the module, ``TorchTrainer`` with 2 CPU
workers (Gloo); the checks of ``tests/workers/ray_job.py``, and the example with every compression."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, free_port, runs_by_compression, worker_env

pytest.importorskip("ray.train")


def driver_env():
    """Horovod is unimportable in the drivers and in the cluster's workers."""
    return worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}", "RAY_DISABLE_USAGE_STATS": "1",
                       "RAY_DEDUP_LOGS": "0"})


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster of 2 CPUs for every driver of the module, as ``ray start --head``
    makes one; its address."""
    ray = str(pathlib.Path(sys.executable).parent / "ray")
    port = free_port()
    started = subprocess.run([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                              "--num-cpus", "2", "--include-dashboard=false", "--disable-usage-stats"],
                             env=driver_env(), capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    yield f"127.0.0.1:{port}"
    subprocess.run([ray, "stop", "--force"], env=driver_env(), capture_output=True, timeout=180)


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
    return runs_by_compression(output, COMPRESSIONS)


@pytest.mark.multiworker
def test_example_trains_and_switches_levels_both_ways(example):
    output = example["accordion"]
    whole = "".join(example.values())
    for rank in (0, 1):
        # A rank's lines are in order: its first 6 epochs are the accordion run's.
        losses = [float(x) for x in re.findall(rf"\[rank {rank}\] epoch +\d+ +loss ([0-9.]+)", whole)][:6]
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
