"""Hugging Face Accelerate with Accordion on 2 real CPU processes (Gloo): the checks under
``torchrun``, and the example under ``accelerate launch``, with every compression."""
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, check_names, free_port, Runs, worker_env

pytest.importorskip("accelerate")


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("accelerate_checks"))
def test_accelerate(launches, check):
    launches("accelerate_checks", "torchrun").check(check)


def accelerate_launch(*args, timeout=300):
    """As a user runs the example: ``accelerate launch --multi_gpu`` starts the 2 processes
    through torchrun (``--cpu`` would start one); Horovod is unimportable there."""
    accelerate = str(pathlib.Path(sys.executable).parent / "accelerate")
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
               "-m", "horovod_accordion.examples.accelerate", *args]
    env = worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}"})
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


COMPRESSIONS = ["accordion", "none", "fp16", "rank1", "rank2", "topk", "accordion-topk"]


@pytest.fixture(scope="module")
def example():
    """The example trains every compression in turn, in one launch."""
    return Runs(accelerate_launch("--epochs", "6", "--decay-epoch", "4", "--compression", *COMPRESSIONS),
                               COMPRESSIONS)


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


@pytest.mark.multiworker
def test_accelerator_without_cpu_true_on_a_cpu_names_the_fix(tmp_path):
    """The natural ``Accelerator()`` on a machine without GPUs runs each launched process alone."""
    script = tmp_path / "natural.py"
    script.write_text("import torch\nfrom accelerate import Accelerator\n"
                      "from horovod_accordion.accelerate import register_accordion\n"
                      "from horovod_accordion.ddp import AccordionState\n"
                      "accelerator = Accelerator()\n"
                      "model = accelerator.prepare(torch.nn.Linear(4, 2))\n"
                      "register_accordion(accelerator, model, AccordionState())\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(script)]
    env = worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}", "CUDA_VISIBLE_DEVICES": ""})
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "TypeError: this process is one of 2 launched" in result.stderr, result.stderr[-3000:]
    assert "Accelerator(cpu=True)" in result.stderr, result.stderr[-3000:]
