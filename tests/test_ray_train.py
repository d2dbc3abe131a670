"""Ray Train with Accordion: a local Ray cluster, ``TorchTrainer`` with 2 CPU workers (Gloo);
the checks of ``tests/workers/ray_job.py``, and the example with every compression."""
import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env

pytest.importorskip("ray.train")


def run_driver(*args, cwd=REPO, timeout=300):
    """A driver process that starts its own local Ray cluster; Horovod is unimportable there."""
    env = worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}", "RAY_DISABLE_USAGE_STATS": "1",
                      "RAY_DEDUP_LOGS": "0"})
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    return result.stdout


@pytest.mark.multiworker
def test_trains_as_the_plain_ddp_hook_and_resumes_bitwise_in_new_workers(tmp_path):
    output = run_driver("-m", "tests.workers.ray_job", str(tmp_path))
    [line] = [line for line in output.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["steps"] == 14 and {"accordion-rank0.pt", "accordion-rank1.pt", "model.pt"} <= set(
        result["checkpoint_files"]), result


@pytest.mark.multiworker
def test_example_trains_and_switches_levels_both_ways():
    output = run_driver("-m", "horovod_accordion.examples.ray_train", "--epochs", "6", "--decay-epoch", "4")
    for rank in (0, 1):
        losses = [float(x) for x in re.findall(rf"\[rank {rank}\] epoch +\d+ +loss ([0-9.]+)", output)]
        assert len(losses) == 6 and losses[-1] < losses[0], output
    assert "check after epoch 0: levels per layer: 0.weight=2" in output, output
    assert re.search(r"check after epoch 2: levels per layer: .*=1", output), output
    assert "LR decay to" in output, output
    assert re.search(r"accordion: test accuracy 0\.9\d+, [0-9.]+ kB sent per rank", output), output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", ["none", "fp16", "rank1", "rank2", "topk", "accordion-topk"])
def test_example_with_every_compression(compression):
    output = run_driver("-m", "horovod_accordion.examples.ray_train", "--epochs", "1", "--compression", compression)
    assert f"{compression}: test accuracy" in output, output
    assert re.search(rf"{compression}: test accuracy 0\.\d+, [0-9.]+ kB sent per rank", output), output
