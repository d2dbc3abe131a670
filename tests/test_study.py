"""The study runner and the plot command, as a user runs them (the study itself is a benchmark)."""
import json
import pathlib
import struct
import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env

RECORDED = REPO / "tests" / "data" / "powersgd_accordion_run.jsonl"


def png_size(path):
    header = pathlib.Path(path).read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def test_plot_command_on_a_recorded_training_log(tmp_path):
    result = subprocess.run([sys.executable, "-m", "horovod_accordion.tools.plot", str(RECORDED), "-o", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    written = sorted(pathlib.Path(line).name for line in result.stdout.split())
    assert written == ["accuracy.png", "levels.png", "norm.png"]
    for name in written:
        width, height = png_size(tmp_path / name)
        assert width > 300 and height > 100


def test_plot_command_on_an_optimizer_log_and_a_named_layer(tmp_path):
    """An optimizer's own log_path has steps, checks and decays but no epochs."""
    records = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    log = tmp_path / "optimizer.jsonl"
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "epoch"}) + "\n"
                           for r in records if r["event"] in ("check", "lr_decay")))
    result = subprocess.run([sys.executable, "-m", "horovod_accordion.tools.plot", str(log), "-o", str(tmp_path / "out"),
                             "--layer", "4.weight"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["levels.png", "norm.png"]
    bad = subprocess.run([sys.executable, "-m", "horovod_accordion.tools.plot", str(log), "-o", str(tmp_path / "bad"),
                          "--layer", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no layer 'nope'" in bad.stderr


@pytest.mark.multiworker
def test_study_smoke_summarizes_and_resumes(tmp_path):
    """One epoch, two ranks, one seed: the summary in its documented shape, then no rerun of a
    finished run, and a rerun of one whose record is incomplete."""
    command = [sys.executable, "benchmarks/study.py", "--setting", "mnist1d-cnn1d", "--rows", "powersgd/*/default",
               "--seeds", "0", "--workers", "2", "--epochs", "1", "--results", str(tmp_path), "--timeout", "300"]

    def study():
        result = subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    assert "runs to do: 7" in study()
    folder = tmp_path / "mnist1d-cnn1d"
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary) == {"command", "dataset", "model", "workers", "epochs", "rows"}
    assert (summary["dataset"], summary["model"], summary["workers"], summary["epochs"]) == ("mnist1d", "cnn1d", 2, 1)
    rows = {row["setting"]: row for row in summary["rows"] if row["family"] == "powersgd"}
    assert sorted(rows) == ["accordion", "error_budget", "fp16", "high", "low", "phase", "uncompressed"]
    # the uncompressed and fp16 runs are every family's references: the other families list them too
    shared = [(r["family"], r["setting"]) for r in summary["rows"] if r["family"] != "powersgd"]
    assert shared == [("topk", "uncompressed"), ("topk", "fp16"), ("quantized", "uncompressed"), ("quantized", "fp16"),
                      ("batch", "small")], shared
    # On 2 workers an allreduce carries each rank's buffer once over its link: wire bytes = handed bytes.
    assert all(row["wire_bytes_per_rank_mean"] == row["bytes_per_rank_mean"] for row in rows.values())
    for row in rows.values():
        assert row["family"] == "powersgd" and row["variant"] == "default" and row["seeds"] == [0]
        assert 0 < row["test_accuracy_mean"] <= 100 and row["test_accuracy_std"] == 0
    assert rows["low"]["levels"] == [4, 4] and rows["accordion"]["levels"] == [4, 1]
    assert rows["error_budget"]["levels"] == rows["phase"]["levels"] == [4, 2, 1]
    assert rows["uncompressed"]["bytes_per_rank_mean"] > rows["fp16"]["bytes_per_rank_mean"] \
        > rows["low"]["bytes_per_rank_mean"] > rows["high"]["bytes_per_rank_mean"]
    # a ladder's levels lie between ℓ_low's bytes and ℓ_high's; the error budget's checks also
    # send its error table, so only the phase schedule, which sends nothing more, stays within ℓ_low's
    assert rows["low"]["bytes_per_rank_mean"] >= rows["phase"]["bytes_per_rank_mean"] \
        >= rows["high"]["bytes_per_rank_mean"]
    assert rows["error_budget"]["bytes_per_rank_mean"] >= rows["high"]["bytes_per_rank_mean"]
    assert rows["low"]["bytes_vs_low"] == 1.0
    record = [json.loads(line) for line in (folder / "runs" / "powersgd-accordion" / "seed0.jsonl").open()]
    epoch = next(r for r in record if r["event"] == "epoch")
    assert {"test_accuracy", "loss", "bytes_sent_per_rank", "wall_time_s", "lr", "levels"} <= set(epoch)
    markdown = (folder / "summary.md").read_text()
    assert "| powersgd | accordion | default | 4/1 | 1 |" in markdown
    assert "| powersgd | error_budget | default | 4/2/1 | 1 |" in markdown
    for png in ("accuracy_powersgd.png", "accuracy_vs_bytes.png", "powersgd-accordion-norm.png"):
        png_size(folder / png)
        assert f"]({png})" in markdown

    finished = folder / "runs" / "powersgd-high" / "seed0.jsonl"
    stamp = finished.stat().st_mtime_ns
    assert "runs to do: 0" in study()
    assert finished.stat().st_mtime_ns == stamp
    lines = finished.read_text().splitlines()
    finished.write_text("\n".join(lines[:-1]) + "\n")  # as if the job died before its last line
    assert "runs to do: 1" in study()
    assert json.loads(finished.read_text().splitlines()[-1])["event"] == "done"


def test_a_log_without_epochs_plots_the_rates_its_checks_and_decays_saw():
    """The DDP example's norm.png had an empty learning-rate axis: its log has no epoch
    records, and one decay event alone is not a schedule."""
    from horovod_accordion.tools.plot import learning_rates
    records = [{"event": "check", "step": 10, "lr": 0.1}, {"event": "check", "step": 30, "lr": 0.1},
               {"event": "lr_decay", "step": 30, "lr": 0.01}, {"event": "check", "step": 50, "lr": 0.01},
               {"event": "check", "step": 60, "lr": None}, {"event": "step", "step": 61}]
    # The decay shares its step with the check before it, and comes after it, as in the log.
    assert learning_rates(records, lambda r: r["step"]) == [(10, 0.1), (30, 0.1), (30, 0.01), (50, 0.01)]


@pytest.mark.multiworker
def test_transformer_setting_smoke(tmp_path):
    """The transformer's setting for two windows on two ranks: validation loss as the score,
    its distance to uncompressed, the recipe and data digest, and the adaptive rows' levels
    per layer type, in the summary and its figures."""
    command = [sys.executable, "benchmarks/study.py", "--setting", "stdlib-transformer", "--precision", "bf16",
               "--rows", "powersgd/uncompressed/default", "powersgd/accordion/default", "powersgd/phase/default",
               "--seeds", "0", "--workers", "2", "--epochs", "2", "--powersgd-levels", "4", "1",
               "--powersgd-ladder", "4", "2", "1", "--results", str(tmp_path), "--timeout", "300"]
    result = subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "runs to do: 3" in result.stdout
    folder = tmp_path / "stdlib-transformer-adamw-bf16"
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["metric"], summary["optimizer"], summary["precision"], summary["epochs"]) == \
        ("validation_loss", "adamw", "bf16", 2)
    assert summary["data"] == corpus_digest()
    rows = {row["setting"]: row for row in summary["rows"]}
    assert sorted(rows) == ["accordion", "phase", "uncompressed"]
    assert rows["uncompressed"]["distance_to_uncompressed"] == 0
    for row in rows.values():
        # a byte-level model that learned anything is below uniform's log(256) = 5.55 nats
        assert 0 < row["validation_loss_mean"] < 5.5 and row["validation_loss_std"] == 0
        assert row["distance_to_uncompressed"] == pytest.approx(
            row["validation_loss_mean"] - rows["uncompressed"]["validation_loss_mean"], abs=1e-4)
    # training starts critical, and the first check closes the last window: ℓ_low throughout
    assert rows["accordion"]["low_share_by_layer_type"] == \
        {"embedding": 1.0, "attention": 1.0, "mlp": 1.0, "output": 1.0}
    assert rows["accordion"]["mean_level_by_layer_type"]["mlp"] == [4, 4]
    assert "low_share_by_layer_type" not in rows["uncompressed"]
    # one event file per run, also for the uncompressed run that both families' rows list
    for run in ("powersgd-accordion", "uncompressed"):
        events = list((folder / "tensorboard" / run / "seed0").glob("events.out.tfevents.*"))
        assert len(events) == 1 and events[0].stat().st_size > 0, events
    markdown = (folder / "summary.md").read_text()
    assert "| powersgd | accordion | default | 4/1 | 1 |" in markdown
    for png in ("validation_loss_powersgd.png", "validation_loss_vs_bytes.png",
                "validation_loss_and_levels_powersgd.png", "powersgd-accordion-validation_loss.png"):
        png_size(folder / png)
        assert f"]({png})" in markdown
    # the same runs under other levels would be skipped and mislabelled: refused before anything runs
    other = [argument if argument != "4" else "2" for argument in command]
    refused = subprocess.run(other, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "finished runs made with other settings" in refused.stderr, refused.stderr
    assert "'levels': [4.0, 1.0]" in refused.stderr and "'levels': ['2', '1']" in refused.stderr, refused.stderr


def test_a_transformer_results_folder_is_not_a_setting():
    result = subprocess.run([sys.executable, "benchmarks/study.py", "--setting", "stdlib-transformer-adamw-fp32",
                             "--summarize-only"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "pass --setting stdlib-transformer with --optimizer" in result.stderr


def corpus_digest():
    script = "import json, stdlib_text; print(json.dumps(stdlib_text.Corpus().digest))"
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO / "examples", capture_output=True, text=True,
                            timeout=120, check=True)
    return json.loads(result.stdout)


@pytest.mark.multiworker
def test_the_transformer_data_split_is_the_same_on_every_rank_and_every_run():
    """Two ranks of one job and a separate process read the same files, split alike: the last
    tenth of the sorted file list is validation, whatever the rank or the run."""
    script = ("import json, horovod.torch as hvd, stdlib_text; hvd.init(); "
              "print('digest', hvd.rank(), json.dumps(stdlib_text.Corpus().digest), flush=True)")
    result = subprocess.run(["horovodrun", "-np", "2", "--gloo", sys.executable, "-c", script],
                            cwd=REPO / "examples", env=worker_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    digests = {}
    for line in result.stdout.splitlines():
        if "digest " in line:
            rank, _, digest = line.split("digest ", 1)[1].partition(" ")
            digests[int(rank)] = json.loads(digest)
    assert sorted(digests) == [0, 1] and digests[0] == digests[1] == corpus_digest()
    digest = digests[0]
    assert digest["validation_files"] == int(digest["files"] * 0.1) and digest["validation_bytes"] > 0
