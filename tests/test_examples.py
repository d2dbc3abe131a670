"""The examples run as users run them: ``horovodrun -np 2 --gloo python examples/...``. An
example trains every compression it is given in turn, so each sweep is one launch, and each
compression's checks read its own run's part of the output. The transformer example, the study's
program, trains one compression per job: its sweep calls the example's own command line and
``main`` once per compression in one job (the study's tests run it as a script)."""
import json
import math
import pathlib
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from tests.conftest import REPO, free_port, Runs, worker_env

HOROVODRUN = str(pathlib.Path(sys.executable).parent / "horovodrun")


def run_example(script, *args, timeout=300, launcher="horovodrun", env=None, processes=2):
    """``launcher="torchrun"``: plain torch.distributed processes, where Horovod cannot be imported."""
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
        env = worker_env({"PYTHONPATH": f"{REPO / 'tests' / 'no_horovod'}:{REPO}", **(env or {})})
    else:
        command, env = [HOROVODRUN, "-np", "2", "--gloo", sys.executable], worker_env(env)
    result = subprocess.run([*command, script, *args], cwd=REPO / "examples", env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


def launched_once(script, compressions, *args, **options):
    """A module-scoped fixture: ``script`` trains ``compressions`` in turn in one launch; each
    compression's part of the output."""
    @pytest.fixture(scope="module")
    def runs():
        return Runs(run_example(script, *args, "--compression", *compressions, **options), compressions)
    return runs


pytorch_demo = launched_once("pytorch_demo.py", ["accordion", "none", "fp16", "rank1", "topk", "accordion-topk",
                                                 "quantized", "accordion-quantized"],
                             "--epochs", "4", "--interval", "2", "--decay-epoch", "3")


@pytest.mark.multiworker
def test_pytorch_demo_loss_goes_down_on_both_ranks_and_prints_levels(pytorch_demo):
    output = pytorch_demo["accordion"]
    for rank in (0, 1):
        losses = [float(x) for x in re.findall(rf"\[rank {rank}\] epoch +\d+ +loss ([0-9.]+)",
                                                pytorch_demo.of_rank(rank, "accordion"))]
        assert len(losses) == 4 and losses[-1] < losses[0], output
    assert "check after epoch 0: levels per layer: 0.weight=2" in output, output
    assert "LR decay to" in output, output
    # the closing comparison with static ℓ_low, from the demo's own runs
    assert re.search(r"accordion: test accuracy 0\.\d+, [0-9.]+ kB sent per rank", output), output
    assert re.search(r"static ℓ_low \(rank 2\): test accuracy 0\.\d+, [0-9.]+ kB sent per rank", output), output
    assert re.search(r"accordion sent [0-9.]+x the bytes of static ℓ_low, at [+-]\d+\.\d points", output), output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", ["none", "fp16", "rank1", "topk", "accordion-topk", "quantized",
                                         "accordion-quantized"])
def test_pytorch_demo_with_every_compression(pytorch_demo, compression):
    output = pytorch_demo[compression]
    assert f"{compression}: test accuracy" in output, output
    assert ("static ℓ_low (TopK 0.99)" in output) == (compression == "accordion-topk"), output
    assert ("static ℓ_low (8 bits)" in output) == (compression == "accordion-quantized"), output


@pytest.mark.multiworker
def test_batch_switch_example_reports_traffic():
    output = run_example("pytorch_batch_switch.py", "--epochs", "6", "--decay-epochs", "4")
    assert re.search(r"global batch 32, 1 micro-batches", output), output
    assert "'mode': 'accordion'" in output, output


keras_fit = launched_once("keras_fit.py", ["accordion-topk", "none", "fp16", "rank1", "accordion", "quantized"],
                          "--epochs", "3")


@pytest.mark.multiworker
def test_keras_fit_example(keras_fit):
    output = keras_fit["accordion-topk"]
    assert output.count("level per layer: dense=") == 3 and "test accuracy" in output, output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", ["none", "fp16", "rank1", "accordion", "quantized"])
def test_keras_fit_example_with_every_compression(keras_fit, compression):
    output = keras_fit[compression]
    assert "test accuracy" in output, output
    assert ("level per layer" in output) == (compression not in ("none", "fp16")), output


@pytest.mark.multiworker
def test_keras_fit_example_with_batch_switching():
    output = run_example("keras_fit.py", "--epochs", "3", "--batch-switch", "4")
    assert output.count("micro-batches per step") == 3 and "test accuracy" in output, output


KERAS3_COMPRESSIONS = ["accordion-topk", "accordion", "none", "fp16", "rank1", "topk", "quantized"]
keras3_fit = launched_once("keras3_fit.py", KERAS3_COMPRESSIONS, "--epochs", "3", env={"TF_USE_LEGACY_KERAS": ""})


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", KERAS3_COMPRESSIONS)
def test_keras3_fit_example_with_every_compression(keras3_fit, compression):
    output = keras3_fit[compression]
    levelled = compression not in ("none", "fp16")  # the others compress the kernels
    assert output.count("level per layer: dense=" if levelled else "level per layer: none (") == 3, output
    assert re.search(r"test accuracy 0\.\d+; bytes sent per rank \d+", output), output


@pytest.mark.multiworker
def test_tensorflow_custom_loop_example_traces_once():
    output = run_example("tensorflow_custom_loop.py", "--epochs", "3")
    assert output.count("traced 1 time(s)") == 2, output


@pytest.fixture(scope="module")
def ddp_plots(tmp_path_factory):
    return tmp_path_factory.mktemp("ddp-plots")


DDP_COMPRESSIONS = ["accordion", "none", "fp16", "rank1", "topk", "accordion-topk", "quantized", "accordion-quantized"]


@pytest.fixture(scope="module")
def ddp_example(ddp_plots):
    output = run_example("ddp_accordion.py", "--epochs", "6", "--decay-epoch", "4", "--plots", str(ddp_plots),
                         "--compression", *DDP_COMPRESSIONS, launcher="torchrun")
    return Runs(output, DDP_COMPRESSIONS)


@pytest.mark.multiworker
def test_ddp_example_trains_switches_levels_and_plots_without_horovod(ddp_example, ddp_plots):
    output = ddp_example["accordion"]
    for rank in (0, 1):
        losses = [float(x) for x in re.findall(rf"\[rank {rank}\] epoch +\d+ +loss ([0-9.]+)",
                                                ddp_example.of_rank(rank, "accordion"))]
        assert len(losses) == 6 and losses[-1] < losses[0], output
    assert "check after epoch 0: levels per layer: 0.weight=2" in output, output
    assert re.search(r"check after epoch 2: levels per layer: .*=1", output), output
    assert "LR decay to" in output, output
    assert re.search(r"accordion: test accuracy 0\.9\d+, [0-9.]+ kB sent per rank", output), output
    assert sorted(p.name for p in (ddp_plots / "accordion").iterdir()) == ["levels.png", "norm.png"], output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", DDP_COMPRESSIONS[1:])
def test_ddp_example_with_every_compression(ddp_example, compression):
    output = ddp_example[compression]
    assert f"{compression}: test accuracy" in output, output
    assert re.search(rf"{compression}: test accuracy 0\.\d+, [0-9.]+ kB sent per rank", output), output


fsdp_example = launched_once("fsdp_accordion.py", DDP_COMPRESSIONS, "--epochs", "6", "--decay-epoch", "4",
                             launcher="torchrun", processes=4)


@pytest.mark.multiworker
def test_fsdp_example_trains_and_switches_levels_on_2_replicas_of_2_shards(fsdp_example):
    output = fsdp_example["accordion"]
    for rank in range(4):
        losses = [float(x) for x in re.findall(rf"\[rank {rank}\] epoch +\d+ +loss ([0-9.]+)",
                                                fsdp_example.of_rank(rank, "accordion"))]
        assert len(losses) == 6 and losses[-1] < losses[0], output
    assert "check after epoch 0: levels per layer: 0.weight=2" in output, output
    assert re.search(r"check after epoch [2-5]: levels per layer: .*=1", output), output
    assert "LR decay to" in output, output
    assert re.search(r"accordion: test accuracy 0\.9\d+, [0-9.]+ kB sent per rank across replicas", output), output


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", DDP_COMPRESSIONS[1:])
def test_fsdp_example_with_every_compression(fsdp_example, compression):
    assert re.search(rf"{compression}: test accuracy 0\.\d+, [0-9.]+ kB sent per rank across replicas",
                     fsdp_example[compression]), fsdp_example[compression]


TRANSFORMER_COMPRESSIONS = [["none"], ["fp16"], ["powersgd", "--levels", "4", "4"], ["powersgd", "--levels", "4", "1"],
                            ["topk", "--levels", "0.1", "0.1"], ["topk", "--levels", "0.5", "0.1"],
                            ["quantized", "--levels", "4", "4"], ["quantized", "--levels", "8", "4"]]
# The example is the study's program, one run per job; here one job runs its command line's
# ``main`` once per compression, so the sweep starts torch and the corpus once, not 8 times.
TRANSFORMER_SWEEP = """
import json, sys
import transformer_lm
hvd = transformer_lm.hvd
hvd.init()
for compression in json.loads(sys.argv[1]):
    print(f"[rank {hvd.rank()}] training with {' '.join(compression)}", flush=True)
    transformer_lm.main(transformer_lm.parse_args([*sys.argv[2:], "--compression", *compression]))
"""


@pytest.fixture(scope="module")
def transformer_example():
    output = run_example("-c", TRANSFORMER_SWEEP, json.dumps(TRANSFORMER_COMPRESSIONS), "--windows", "2",
                         "--steps-per-window", "4", "--interval", "1", "--warmup-steps", "2",
                         "--validation-sequences", "16")
    return Runs(output, [" ".join(compression) for compression in TRANSFORMER_COMPRESSIONS])


@pytest.mark.multiworker
@pytest.mark.parametrize("compression", TRANSFORMER_COMPRESSIONS, ids=" ".join)
def test_transformer_example_with_every_compression(transformer_example, compression):
    output = transformer_example[" ".join(compression)]
    assert re.search(rf"\[rank 0\] {compression[0]}: validation loss [0-9.]+ nats per byte, [0-9.]+ MB sent", output)
    losses = [float(x) for x in re.findall(r"train: epoch [12]/2 .* validation ([0-9.]+)", output)]
    assert len(losses) == 2 and losses[1] < losses[0], output
    levels = re.findall(r"train: epoch 2/2 .* levels ?(\S*)", output)
    assert levels and (levels[0] != "") == (compression[0] in ("powersgd", "topk", "quantized")), output


def test_a_diverged_transformer_run_goes_on_and_records_it():
    """An SGD run of the study whose loss reached 101 nats ended in OverflowError computing its
    perplexity, so its row lost the run instead of showing the divergence."""
    script = ("import math, transformer_lm as t; "
              "print(t.perplexity(101.43), t.perplexity(1e4), t.perplexity(math.nan), t.perplexity(math.log(2.0)))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO / "examples", env=worker_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    big, overflow, nan, two = (float(value) for value in result.stdout.split())
    assert big == pytest.approx(math.exp(101.43), rel=1e-12) and overflow == math.inf and math.isnan(nan)
    assert two == pytest.approx(2.0, rel=1e-12)


@pytest.mark.multiworker
def test_under_horovodrun_progress_is_one_plain_line_per_epoch_and_no_progress_keeps_the_result():
    """horovodrun pipes stderr and prefixes each chunk, so a tqdm bar arrived as garbled
    carriage-return fragments; and --no-progress used to print nothing at all."""
    args = ["--dataset", "digits", "--model", "mlp", "--epochs", "2", "--compression", "powersgd",
            "--levels", "2", "1"]
    output = run_example("pytorch_train.py", *args)
    assert "\r" not in output and "it/s" not in output, output
    assert len(re.findall(r"<stdout>:train: epoch [12]/2  loss [0-9.]+  acc [0-9.]+  MB [0-9.]+  levels ", output)) == 2
    quiet = run_example("pytorch_train.py", *args, "--no-progress")
    assert "train: epoch" not in quiet
    assert re.search(r"<stdout>:\[rank 0\] powersgd: test accuracy [0-9.]+ %, [0-9.]+ MB sent per rank", quiet), quiet


MNIST1D_AS_GENERATED = """
import numpy as np, example_data
from mnist1d.data import get_dataset_args, make_dataset
made = make_dataset(get_dataset_args())
x, y, x_test, y_test = example_data.load("mnist1d")
assert np.array_equal(x[:, 0], made["x"].astype(np.float32)) and np.array_equal(y, made["y"])
assert np.array_equal(x_test[:, 0], made["x_test"].astype(np.float32)) and np.array_equal(y_test, made["y_test"])
assert x.dtype == x_test.dtype == np.float32 and y.dtype == y_test.dtype == np.int64
np.savez("loaded.npz", x=x, y=y, x_test=x_test, y_test=y_test)
"""
# The same load where mnist1d cannot generate anything: it must come from the cache.
MNIST1D_FROM_THE_CACHE_ALONE = """
import sys, numpy as np
sys.modules["mnist1d.data"] = None
import example_data
loaded = np.load("loaded.npz")
for kept, first in zip(example_data.load("mnist1d"), (loaded[key] for key in ("x", "y", "x_test", "y_test"))):
    assert np.array_equal(kept, first) and kept.dtype == first.dtype
"""


def test_mnist1d_is_generated_once_then_read_back_from_the_cache(tmp_path):
    env = worker_env({"HOROVOD_ACCORDION_CACHE": str(tmp_path / "cache"),
                      "PYTHONPATH": f"{REPO / 'examples'}:{REPO}"})
    for script in (MNIST1D_AS_GENERATED, MNIST1D_FROM_THE_CACHE_ALONE):
        result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in (tmp_path / "cache" / "datasets").iterdir()] == [f"mnist1d-{version('mnist1d')}.npz"]
