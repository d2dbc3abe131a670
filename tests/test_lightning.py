"""Lightning with Accordion on 2 real CPU processes (``torchrun``, Gloo): a training launch,
then a launch that resumes from its mid-run checkpoint; and the example, with every compression."""
import re

import pytest

from tests.conftest import check_names, run_workers, Runs
from tests.test_examples import run_example

pytest.importorskip("lightning")


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    shared = tmp_path_factory.mktemp("lightning-shared")
    env = {"ACCORDION_SHARED_DIR": str(shared)}
    first = run_workers("lightning_checks", tmp_path_factory.mktemp("lightning"), controller="torchrun", env=env)
    resumed = run_workers("lightning_resume_checks", tmp_path_factory.mktemp("lightning-resume"),
                          controller="torchrun", env=env)
    return {"lightning_checks": first, "lightning_resume_checks": resumed}


@pytest.mark.multiworker
@pytest.mark.parametrize("module,check", [(module, check) for module in ("lightning_checks", "lightning_resume_checks")
                                          for check in check_names(module)])
def test_lightning(launches, module, check):
    launches[module].check(check)


COMPRESSIONS = ["accordion", "none", "fp16", "rank1", "rank2", "topk", "accordion-topk"]


@pytest.fixture(scope="module")
def example():
    """The example trains every compression in turn, in one launch."""
    return Runs(run_example("-m", "horovod_accordion.examples.lightning", "--epochs", "6", "--decay-epoch",
                                           "4", "--compression", *COMPRESSIONS, launcher="torchrun"), COMPRESSIONS)


@pytest.mark.multiworker
def test_example_trains_and_switches_levels_both_ways(example):
    output = example["accordion"]
    losses = [float(x) for x in re.findall(r"\[rank 0\] epoch +\d+ +loss ([0-9.]+)", output)]
    assert len(losses) == 6 and losses[-1] < losses[0], output
    assert "check after epoch 0: levels per layer: net.0.weight=2" in output, output
    assert re.search(r"check after epoch 2: levels per layer: .*=1", output), output
    assert "LR decay to" in output, output
    assert re.search(r"accordion: test accuracy 0\.9\d+, [0-9.]+ kB sent per rank", output), output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", COMPRESSIONS[1:])
def test_example_with_every_compression(example, compression):
    output = example[compression]
    assert f"{compression}: test accuracy" in output, output
    assert re.search(rf"{compression}: test accuracy 0\.\d+, [0-9.]+ kB sent per rank", output), output
