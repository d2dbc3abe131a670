"""The advisor (``python -m horovod_accordion.advise``): its bytes against our optimizer's, the
wire model and the overlap schedule on hand-computed cases, the CLI on a committed profile (its
argument errors, no matplotlib, a profile taken on a busy machine), the validation against
GRACE's published throughputs (``benchmarks/advise_grace.py``), and Quantized's variants and bytes
on world sizes not profiled."""
import copy
import json
import math
import os
import pathlib
import re
import runpy
import shlex
import subprocess
import sys

import pytest

from horovod_accordion.advise.__main__ import main as advise
from horovod_accordion.advise.hsdp import predict_hsdp, shard_shape
from horovod_accordion.advise.predict import predict
from horovod_accordion.advise.schedule import Bucket, Segment, Step, step_seconds
from horovod_accordion.advise.variants import parse_variant
from horovod_accordion.advise.wire import Link, collective_seconds, parse_link
from horovod_accordion.core.compression import Quantized, padded_length, quantized_bytes

REPO = pathlib.Path(__file__).resolve().parents[1]
PROFILE = REPO / "benchmarks" / "results" / "profiles" / "resnet18-cifar_cpu_1thread.json"
# 8 Mbit/s = 1 MB/s and 1 ms per hop: round numbers to compute by hand.
SLOW = Link("8mbit", 8e6, latency_s=1e-3)


@pytest.mark.multiworker
def test_bytes_equal_the_optimizers_count_per_variant(launches):
    pairs = launches("advise_checks", "gloo").check("check_bytes_per_variant")[0]
    assert len(pairs) == 13
    assert {name: real for name, (real, _) in pairs.items()} == {name: advised for name, (_, advised) in pairs.items()}
    assert pairs["powersgd:1/fixed"][0] < pairs["powersgd:2/fixed"][0] < pairs["none/fixed"][0]


def test_link_rates_parse_as_tc_writes_them():
    assert parse_link("10gbit").bits_per_s == 10e9
    assert parse_link("100mbit").bytes_per_s == 12.5e6
    assert parse_link("1gbit", shared_by=2).bytes_per_s == 62.5e6
    with pytest.raises(ValueError, match="10gbit"):
        parse_link("10 GB/s")


def test_ring_allreduce_and_allgather_by_hand():
    # W = 4, 1 MB per rank: allreduce moves 2·3/4 MB in 2·3 steps; allgather 3 MB in 3 steps.
    assert collective_seconds("allreduce", 1e6, 4, SLOW) == pytest.approx(6 * 1e-3 + 1.5)
    assert collective_seconds("allgather", 1e6, 4, SLOW) == pytest.approx(3 * 1e-3 + 3.0)
    # Tree: the same bandwidth term, 2·⌈log2 5⌉ = 6 latency steps instead of the ring's 8.
    assert collective_seconds("allreduce", 1e6, 5, SLOW, "tree") == pytest.approx(6 * 1e-3 + 1.6)
    assert collective_seconds("allreduce", 1e6, 1, SLOW) == 0.0
    # The benchmarks' shared loopback: 2 ranks' 44.7 MB through one 1 Gbit/s link, as speed.py's bound.
    shared = parse_link("1gbit", latency_s=0, shared_by=2)
    assert collective_seconds("allreduce", 44_695_848, 2, shared) == pytest.approx(0.7151, abs=1e-4)


def test_all_to_all_by_hand_and_quantizeds_two_shots_cost_a_ring_allreduce():
    # W = 4, 1 MB per rank, 0.25 MB for each rank: 3 pairwise steps of 0.25 MB, whatever the algorithm.
    assert collective_seconds("alltoall", 1e6, 4, SLOW) == pytest.approx(3 * 1e-3 + 0.75)
    assert collective_seconds("alltoall", 1e6, 4, SLOW, "tree") == collective_seconds("alltoall", 1e6, 4, SLOW)
    assert collective_seconds("alltoall", 1e6, 1, SLOW) == 0.0
    # Quantized's all-to-all of B and all-gather of B/W: 2(W − 1)/W·B, as a ring allreduce of B.
    for workers in (2, 5, 64):
        two_shots = collective_seconds("alltoall", 1e6, workers, SLOW) + \
            collective_seconds("allgather", 1e6 / workers, workers, SLOW)
        assert two_shots == pytest.approx(collective_seconds("allreduce", 1e6, workers, SLOW))
    with pytest.raises(ValueError, match="'alltoall'"):
        collective_seconds("all_to_all", 1e6, 4, SLOW)


def _powersgd_bucket(ready):
    """P (1 MB) after 0.1 s of maths, Q (1 MB) after 0.2 s more, then 0.05 s to decompress."""
    return Bucket(ready, [Segment(0.1, [("allreduce", 2e6)]), Segment(0.2, [("allreduce", 2e6)]), Segment(0.05)])


def test_schedule_overlaps_p_with_backward_and_q_waits_for_p():
    # W = 2 on SLOW: an allreduce of 2 MB costs 2·1 ms + 2 s.
    wire = 2.002
    step = Step(forward_s=1.0, backward_s=3.0, optimizer_s=0.5,
                buckets=[_powersgd_bucket(0.5), _powersgd_bucket(2.0)])
    # Bucket 0: P issued at 1 + 0.5 + 0.1 = 1.6, done 3.602. Bucket 1: ready at 1 + 2 + 0.1 (the
    # first hook delayed backward), P issued at 3.2, queued behind bucket 0's, done 5.604.
    # Backward ends at 1 + 3 + 0.2 = 4.2. Bucket 0's Q: issued at 4.2 + 0.2 = 4.4, queued until 5.604,
    # done 7.606. Bucket 1's Q: issued at max(4.4, 5.604) + 0.2 = 5.804, sent 7.606–9.608.
    # Bucket 0 decompresses 7.606 + 0.05 (before bucket 1 is waited on), bucket 1 at 9.608 + 0.05.
    expected = 5.604 + 2 * wire + 0.05 + 0.5
    assert step_seconds(step, 2, SLOW) == pytest.approx(expected)
    # With no wire cost the step is compute alone: the hooks' maths lengthens backward.
    free = Link("free", float("inf"), latency_s=0)
    assert step_seconds(step, 2, free) == pytest.approx(1 + 3 + 0.2 + 0.2 + 0.2 + 0.05 + 0.05 + 0.5)


def test_schedule_fuses_queued_dense_gradients_as_horovod():
    # Three 1 MB gradients, ready at 0, 0.1 and 0.2 s of a 0.3 s backward, W = 2: the first goes
    # alone (1.002 s), the next two wait behind it and go as one 2 MB allreduce (one latency).
    dense = [Bucket(t, [Segment(0.0, [("allreduce", 1e6)]), Segment(0.0)], fusable=True) for t in (0, 0.1, 0.2)]
    assert step_seconds(Step(0.0, 0.3, dense, 0.0), 2, SLOW) == pytest.approx(1.002 + 2.002)
    unfused = [Bucket(b.ready_s, b.segments) for b in dense]
    assert step_seconds(Step(0.0, 0.3, unfused, 0.0), 2, SLOW) == pytest.approx(3 * 1.002)


def test_accordion_mixes_its_levels_by_the_fraction_at_low():
    profile = json.loads(PROFILE.read_text())
    link = parse_link("1gbit")
    at = {fraction: predict(profile, "accordion:powersgd:4/1", "horovod", 16, link, low_fraction=fraction)
          for fraction in (0.0, 0.25, 1.0)}
    for statistic in ("fastest", "median", "slowest"):
        assert at[0.25][statistic] == pytest.approx(0.25 * at[1.0][statistic] + 0.75 * at[0.0][statistic])


def test_the_docs_offline_command_prints_its_table_and_writes_its_png_without_torch(tmp_path):
    """The command that docs/advise.md shows, run as it is, from the committed profile."""
    page = (REPO / "docs" / "advise.md").read_text()
    command = re.search(r"<!-- test: tests/test_advise.py[^>]*-->\n```bash\n(.*?)\n```", page, re.S).group(1)
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "horovod_accordion.advise"] and "--profile" in argv
    png = tmp_path / "advise.png"
    script = ("import sys, runpy; sys.argv = sys.argv[1:]; "
              "runpy.run_module('horovod_accordion.advise', run_name='__main__'); "
              "print('imported torch:', 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script, "advise", *argv[3:], "--png", str(png)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "16 workers, 100gbit:" in result.stdout and "fastest" in result.stdout
    assert "imported torch: False" in result.stdout
    assert "UNRELIABLE" not in result.stdout, "the committed profile's repeats agree within 2x"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _advise(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "horovod_accordion.advise", "--profile", str(PROFILE), *argv],
                          capture_output=True, text=True, cwd=REPO, timeout=120, env=env)


@pytest.mark.parametrize("argv, accepted", [
    (["--compressions", "none,powersgd"], ["'powersgd': the rank is missing", "powersgd:R", "topk:F", "quantized:B",
                                           "accordion:powersgd:LOW/HIGH", "accordion:topk:LOW/HIGH",
                                           "accordion:quantized:LOW/HIGH"]),
    (["--link", "10gb"], ["link '10gb'", "mbit, gbit or tbit", "10gbit"]),
    (["--workers", "4,sixteen"], ["world sizes are positive integers", "4,16,64"]),
    (["--check-every", "0"], ["a positive integer, got '0'"]),
    (["--low-fraction", "study:no/such/summary.json"], ["no/such/summary.json"]),
])
def test_an_argument_mistake_is_an_argparse_error_that_lists_the_accepted_forms(argv, accepted, tmp_path):
    result = _advise(*argv, "--png", str(tmp_path / "advise.png"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "usage:" in result.stderr
    assert f"error: argument {argv[0]}:" in result.stderr
    for form in accepted:
        assert form in result.stderr


def test_without_matplotlib_the_table_is_printed_and_the_picture_explained(tmp_path):
    """``tests/no_matplotlib`` makes ``import matplotlib`` fail, as without the ``plot`` extra."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "no_matplotlib"), str(REPO)]))
    png = tmp_path / "advise.png"
    result = _advise("--workers", "4,16", "--link", "1gbit", "--png", str(png), env=env)
    assert result.returncode == 0, result.stderr
    assert "16 workers, 1gbit:" in result.stdout and "fastest" in result.stdout
    assert "pip install matplotlib" in result.stdout
    assert re.search(r"pip install 'horovod_accordion-<version>-py3-none-any\.whl\[plot\]'", result.stdout), result.stdout
    assert not png.exists()


def test_a_profile_whose_repeats_spread_more_than_twice_is_reported_unreliable(tmp_path, capsys):
    profile = json.loads(PROFILE.read_text())
    backward = profile["compute"]["backward_s"]
    backward[-1] = 3 * min(backward)  # one repeat taken while something else ran
    busy = tmp_path / "busy_profile.json"
    busy.write_text(json.dumps(profile))
    advise(["--profile", str(busy), "--workers", "4,16", "--link", "10gbit", "--png", str(tmp_path / "a.png")])
    out = capsys.readouterr().out
    assert "16 workers, 10gbit:" in out
    warning = out[out.index("UNRELIABLE PROFILE"):]
    assert "backward 3.0×" in warning and "busy" in warning
    assert "quiet machine" in warning and "--device cuda" in warning and "--repeats" in warning


# --- Validation against GRACE's published throughputs (benchmarks/advise_grace.py) -------------

GRACE = REPO / "benchmarks" / "advise_grace.py"


def test_the_grace_validation_json_is_what_its_script_writes(tmp_path):
    """The script is arithmetic only (a few seconds); the committed JSON must be its output."""
    out = tmp_path / "advise_grace.json"
    result = subprocess.run([sys.executable, str(GRACE), "--out", str(out)], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    committed = json.loads((REPO / "benchmarks" / "results" / "advise_grace.json").read_text())
    assert json.loads(out.read_text()) == committed
    assert committed["command"] == "python benchmarks/advise_grace.py"
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_grace_model_tables_are_resnet50_and_vgg19():
    """The hand-written ResNet-50 is torchvision's (our H200 profile records its shapes), in TF's
    layouts; VGG19 has its known size; GRACE's TF PowerSGD sends a 1×1 conv's gradient whole."""
    grace = runpy.run_path(str(GRACE))
    torch_layout = {4: lambda s: (s[3], s[2], s[0], s[1]), 2: lambda s: (s[1], s[0]), 1: lambda s: s}
    ours = [list(torch_layout[len(shape)](shape)) for layer in grace["resnet50"]() for shape in layer.shapes]
    profiled = json.loads((REPO / "benchmarks" / "results" / "profiles" / "resnet50-imagenet-b64_h200.json")
                          .read_text())["layers"]
    assert ours == [layer["shape"] for layer in profiled]
    vgg19 = grace["vgg19"]()
    assert sum(len(layer.shapes) for layer in vgg19) == 38 and grace["parameters"](vgg19) == 143_667_240
    p, q, decompress = grace["tensor_segments"]((1, 1, 256, 64), "powersgd", None, 0.0)
    assert p.collectives == [("allreduce", 4)] and q.collectives == [("allreduce", 4 * 256 * 64)]
    selection, _ = grace["tensor_segments"]((3, 3, 64, 64), "topk", 0.01, 0.0)
    assert selection.collectives == [("allgather", 8 * 368)]


def test_hybrid_sharding_adds_the_fast_collectives_and_each_units_exchange_by_hand():
    """One 4 MB layer on 2 shards × 2 replicas. Fast link 10 MB/s, 1 ms per hop: two all-gathers of
    2 MB per rank (0.201 s each) and one reduce-scatter of 4 MB (1 step of 2 MB: 0.201 s). Slow link
    1 MB/s: the unit's 0.1 s of maths, then its 2 MB allreduce over 2 replicas (2 steps, 2 MB moved:
    2.002 s), nothing overlapped. Compute: forward 1 s, backward 2 s, the optimizer's 0.4 s on half
    the parameters."""
    exchange = {"buckets": [{"layers": [0], "fusable": False,
                             "segments": [{"compute_s": [0.1], "collectives": [["allreduce", 2e6]]}]}],
                "check_s": [], "check_collectives": []}
    profile = {"compute": {"forward_s": [1.0], "backward_s": [2.0], "optimizer_s": [0.4]},
               "layers": [{"name": "w", "shape": [1000, 1000], "bytes": 4e6}],
               "exchanges": {"none": {"hsdp:2": {"2": {"fixed": exchange}}}}}
    fast = Link("80mbit", 80e6, latency_s=1e-3)
    predicted = predict_hsdp(profile, "none", 2, 2, fast, SLOW)
    assert predicted["median"] == pytest.approx(3.2 + 3 * 0.201 + 0.1 + 2.002)
    assert collective_seconds("reduce_scatter", 4e6, 2, fast) == pytest.approx(0.201)
    assert shard_shape((15, 16), 2) == (8, 16) and shard_shape((3,), 4) == (1,)


def test_the_hsdp_validation_json_is_what_its_script_writes_and_the_cli_predicts_the_same(tmp_path):
    """``benchmarks/advise_hsdp.py`` is arithmetic on a committed profile and measurement; the
    CLI's ``--layout hsdp`` (its default link sharing: the shards) gives the same step."""
    out = tmp_path / "advise_hsdp.json"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "advise_hsdp.py"), "--out", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    committed = json.loads((REPO / "benchmarks" / "results" / "advise_hsdp.json").read_text())
    assert json.loads(out.read_text()) == committed
    cli = subprocess.run([sys.executable, "-m", "horovod_accordion.advise", "--profile",
                          str(REPO / "benchmarks" / "results" / "profiles" / "resnet18-cifar_cpu_1thread_hsdp2.json"),
                          "--layout", "hsdp", "--shards", "2", "--fast-link", "10gbit", "--latency-us", "67",
                          "--workers", "2", "--link", "100mbit", "--compressions", "powersgd:1",
                          "--png", str(tmp_path / "advise.png")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert cli.returncode == 0, cli.stderr
    for name in ("none", "powersgd:1"):
        predicted_ms = committed["rows"][name]["predicted_s"]["100mbit"] * 1e3
        assert re.search(rf"^\s+2\s+{name}\s+{predicted_ms:.0f}\.\d", cli.stdout, re.M), (name, predicted_ms, cli.stdout)


# --- Offline reuse, the flags' errors and defaults (issue 43) ---------------------------------


def tiny_model():
    """A factory for ``--model tests.test_advise:tiny_model``: profiles in a second."""
    import torch
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def test_the_committed_profile_has_the_same_exchange_on_every_world_size_except_topks():
    """The premise of reusing a profile on another world size: every exchange but TopK's sends the
    same collectives and bytes on every world size above 1."""
    from horovod_accordion.advise.predict import same_at_every_world_size
    for variant, layouts in json.loads(PROFILE.read_text())["exchanges"].items():
        for layout, sizes in layouts.items():
            wires = {json.dumps({key: ([s["collectives"] for b in exchange["buckets"] for s in b["segments"]],
                                       exchange["step_bytes"], exchange["check_collectives"])
                                 for key, exchange in levels.items()}) for w, levels in sizes.items() if int(w) > 1}
            assert (len(wires) == 1) == same_at_every_world_size(variant), (variant, layout)


def test_a_saved_profile_predicts_a_world_size_it_lacks_where_the_exchange_does_not_depend_on_it(tmp_path):
    profile = json.loads(PROFILE.read_text())
    assert "32" not in profile["exchanges"]["powersgd:2"]["ddp"]
    at_32 = predict(profile, "powersgd:2", "ddp", 32, SLOW)
    # By construction the same exchange as on 16 workers, whose wire time alone is the world's.
    profile["exchanges"]["powersgd:2"]["ddp"]["32"] = profile["exchanges"]["powersgd:2"]["ddp"]["16"]
    assert at_32 == predict(profile, "powersgd:2", "ddp", 32, SLOW)
    result = _advise("--workers", "32", "--link", "1gbit", "--layout", "ddp", "--compressions",
                     "none,fp16,powersgd:2,accordion:powersgd:2/1", "--png", str(tmp_path / "a.png"))
    assert result.returncode == 0, result.stderr
    assert "32 workers, 1gbit:" in result.stdout


def test_what_a_saved_profile_cannot_serve_ends_in_the_exact_command_to_profile_again(tmp_path):
    """It ended in a dump of nested dicts that named no flag."""
    for argv, why in ((["--workers", "32"], "TopK's exchange depends on the world size"),
                      (["--workers", "2", "--layout", "hsdp", "--shards", "4"], "profiled in the ddp, horovod layout")):
        result = _advise(*argv, "--link", "1gbit", "--png", str(tmp_path / "a.png"))
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert why in result.stderr and "{'" not in result.stderr, result.stderr
        command = shlex.split(result.stderr.strip().splitlines()[-1])
        assert command[:5] == ["python", "-m", "horovod_accordion.advise", "--model", "resnet18-cifar"], command
        flags = dict(zip(command[3::2], command[4::2]))
        assert flags["--workers"] == argv[1] and flags["--save-profile"] == str(PROFILE), flags
        assert flags["--threads"] == "1" and flags["--batch"] == "16" and flags["--input-shape"] == "3,32,32"
        assert "topk:0.01" in flags["--compressions"] and "powersgd:2" in flags["--compressions"], flags
        if "--layout" in argv:
            assert flags["--layout"] == "hsdp" and flags["--shards"] == "4", flags


def test_hsdp_without_shards_is_an_error_that_names_the_flag(tmp_path):
    """It used 8 shards without a word."""
    result = _advise("--layout", "hsdp", "--workers", "2", "--png", str(tmp_path / "a.png"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "error: argument --shards: --layout hsdp needs it" in result.stderr


def test_help_shows_the_defaults_and_the_hsdp_example_as_one_command():
    result = subprocess.run([sys.executable, "-m", "horovod_accordion.advise", "--help"], capture_output=True,
                            text=True, cwd=REPO, timeout=60)
    text = " ".join(result.stdout.split())
    for default in ("(default: 8,64,256)", "(default: 1)", "(default: horovod)", "(default: 400gbit)"):
        assert default in text, default
    example = [line for line in result.stdout.splitlines() if "--layout hsdp --shards 8" in line]
    assert example and example[0].rstrip().endswith("\\"), example


def test_a_profile_is_taken_single_threaded_unless_told(tmp_path):
    """torch's default, a thread per core, spreads the timings on a machine that other work shares."""
    saved = {}
    for threads in (None, "2"):
        path = tmp_path / f"profile-{threads}.json"
        result = subprocess.run(
            [sys.executable, "-m", "horovod_accordion.advise", "--model", "tests.test_advise:tiny_model",
             "--input-shape", "4", "--batch", "2", "--repeats", "1", "--compressions", "none", "--workers", "2",
             "--link", "1gbit", "--save-profile", str(path), "--png", str(tmp_path / "a.png"),
             *(["--threads", threads] if threads else [])], capture_output=True, text=True, cwd=REPO, timeout=300)
        assert result.returncode == 0, result.stderr
        saved[threads] = json.loads(path.read_text())["threads"]
    assert saved == {None: 1, "2": 2}


def test_the_unreliable_warning_comes_before_the_verdicts_and_is_on_the_picture(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    drawn = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *a, **k: (drawn.extend(t.get_text() for t in figure.texts),
                                                                    savefig(figure, *a, **k)))
    profile = json.loads(PROFILE.read_text())
    profile["compute"]["backward_s"][-1] = 3 * min(profile["compute"]["backward_s"])
    busy = tmp_path / "busy_profile.json"
    busy.write_text(json.dumps(profile))
    advise(["--profile", str(busy), "--workers", "4,16", "--link", "10gbit", "--png", str(tmp_path / "a.png")])
    out = capsys.readouterr().out
    assert out.index("UNRELIABLE PROFILE") < out.index("4 workers, 10gbit:"), out
    assert any("UNRELIABLE PROFILE" in text and "backward 3.0×" in text for text in drawn), drawn


# --- Quantized: its variants, and its bytes on every world size ---------------------------------


@pytest.mark.parametrize("text, bits", [("quantized:4", (4, 4)), (" Quantized:2", (2, 2)), ("quantized:8", (8, 8)),
                                        ("accordion:quantized:8/4", (8, 4)), ("accordion:quantized:8/2", (8, 2))])
def test_quantized_variants_parse(text, bits):
    variant = parse_variant(text)
    assert variant.compression == Quantized(*bits) and (variant.level("low"), variant.level("high")) == bits
    assert variant.level_keys == (("low", "high") if bits[0] != bits[1] else ("fixed",))


@pytest.mark.parametrize("text, why", [
    ("quantized", "the bit width is missing"),
    ("quantized:4.5", "the bit width is not a number: '4.5'"),
    ("quantized:9", "from 2 to 8, got 9"),
    ("quantized:1", "from 2 to 8, got 1"),
    ("accordion:quantized:8", "ℓ_high's bit width is missing"),
    ("accordion:quantized:4/8", "swap them"),
    ("quantised:4", "unknown compression"),
])
def test_a_misspelt_quantized_variant_says_why_and_lists_the_accepted_forms(text, why):
    with pytest.raises(ValueError) as raised:
        parse_variant(text)
    message = str(raised.value)
    assert why in message and "quantized:B (B bits per value, 2 to 8" in message, message
    assert "accordion:quantized:LOW/HIGH (e.g. accordion:quantized:8/4)" in message, message


QUANTIZED = ("quantized:4", "accordion:quantized:8/3")


@pytest.fixture(scope="module")
def quantized_profile():
    """A profile of a small model (a 40×50 layer, and layers smaller than a block) with the
    quantized variants on 2 and 8 workers: one second."""
    import torch
    from horovod_accordion.advise.profile import profile_model
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 50), torch.nn.ReLU(), torch.nn.Linear(50, 3))
    inputs, targets = torch.randn(4, 40), torch.randint(0, 3, (4,))
    return profile_model(model, inputs, targets, [parse_variant(name) for name in QUANTIZED], [2, 8],
                         layouts=("horovod", "hsdp:2"), repeats=1)


def _wire(levels):
    return {key: ([[s["collectives"] for s in b["segments"]] for b in exchange["buckets"]], exchange["step_bytes"],
                  exchange["check_collectives"]) for key, exchange in levels.items()}


def test_a_quantized_exchange_on_a_world_size_not_profiled_has_the_bytes_profiled_there(quantized_profile):
    """Each layer is padded to W parts of whole blocks, so the bytes depend on W: recomputed from
    the layers (their shards in hybrid sharding), they are those the reducer hands over there."""
    from horovod_accordion.advise.predict import exchange_of, same_at_every_world_size
    for variant in QUANTIZED:
        assert not same_at_every_world_size(variant)
        for layout, sizes in quantized_profile["exchanges"][variant].items():
            assert _wire(sizes["2"]) != _wire(sizes["8"]), (variant, layout)
            for workers, other in (("2", "8"), ("8", "2")):
                only_other = copy.deepcopy(quantized_profile)
                del only_other["exchanges"][variant][layout][workers]
                derived = exchange_of(only_other, variant, layout, int(workers))
                assert _wire(derived) == _wire(sizes[workers]), (variant, layout, workers)
                assert [s["compute_s"] for e in derived.values() for b in e["buckets"] for s in b["segments"]] == \
                    [s["compute_s"] for e in sizes[other].values() for b in e["buckets"] for s in b["segments"]]


def test_a_quantized_prediction_sends_twice_w_minus_1_over_w_of_the_quantized_bytes(quantized_profile):
    """With every measured time zero, the step is the wire alone: one bucket's all-to-all and
    all-gather, 2(W − 1) latencies and 2(W − 1)/W of the layers' quantized bytes, each layer
    padded to W parts of whole blocks: on the world sizes profiled and on one derived (64)."""
    timeless = copy.deepcopy(quantized_profile)
    compute = timeless["compute"]
    compute.update({key: [0.0] for key in ("forward_s", "backward_s", "optimizer_s")},
                   layer_ready_s=[[0.0] for _ in compute["layer_ready_s"]])
    for exchange in (e for sizes in timeless["exchanges"]["quantized:4"].values()
                     for levels in sizes.values() for e in levels.values()):
        for segment in (s for bucket in exchange["buckets"] for s in bucket["segments"]):
            segment["compute_s"] = [0.0]
    sizes = [math.prod(layer["shape"]) for layer in timeless["layers"]]
    for workers in (2, 8, 64):
        quantized = sum(quantized_bytes(padded_length(size, workers, 64), 4, 64) for size in sizes)
        expected = 2 * (workers - 1) * SLOW.latency_s + 2 * (workers - 1) / workers * quantized / SLOW.bytes_per_s
        predicted = predict(timeless, "quantized:4", "horovod", workers, SLOW)
        assert predicted == {name: pytest.approx(expected) for name in ("fastest", "median", "slowest")}, workers
    # 2000 + 50 + 150 + 3 values: 64 workers pad them to 4096 + 3 × 4096.
    assert sum(padded_length(size, 64, 64) for size in sizes) == 16 * 1024
