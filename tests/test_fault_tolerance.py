"""Jobs that stop: a resume in a new ``horovodrun`` job continues bit-identically, and a
killed worker ends the job instead of hanging the survivor."""
import json
import math
import pathlib
import subprocess
import sys
import time

import pytest

from tests.conftest import CONTROLLERS, REPO, worker_env

HOROVODRUN = str(pathlib.Path(sys.executable).parent / "horovodrun")


def horovodrun(controller, module, *args, timeout=300):
    return subprocess.run([HOROVODRUN, "-np", "2", f"--{controller}", sys.executable, "-m", module, *args],
                          cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """``resumed(controller)``: the folder of a full job and a resuming job, each running the torch
    job's phase then the Keras job's (``tests/workers/resume_jobs.py``); each job's outcome."""
    jobs = {}

    def run(controller):
        if controller not in jobs:
            directory = tmp_path_factory.mktemp(f"resume-{controller}")
            jobs[controller] = directory, [horovodrun(controller, "tests.workers.resume_jobs", phase, str(directory))
                                           for phase in ("full", "resume")]
        return jobs[controller]

    return run


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_resume_in_a_new_job_is_bitwise_identical_to_an_uninterrupted_run(framework, controller, resumed):
    directory, jobs = resumed(controller)
    for phase, job in zip(("full", "resume"), jobs):
        assert job.returncode == 0, f"{phase}: " + job.stdout[-3000:] + job.stderr[-3000:]
    reports = [json.loads((directory / framework / f"resume.rank{rank}.json").read_text()) for rank in (0, 1)]
    rank_zero_resumes = [report.pop("rank0_only", None) for report in reports]
    if framework == "keras":  # and a resume where only rank 0 read its checkpoint
        assert rank_zero_resumes[0] == rank_zero_resumes[1], rank_zero_resumes
        assert rank_zero_resumes[0]["weights_identical_across_ranks"], rank_zero_resumes
        assert rank_zero_resumes[0]["steps"] == reports[0]["powersgd"]["steps"], rank_zero_resumes
    for rank, report in enumerate(reports):
        for variant, outcome in report.items():
            assert outcome["bitwise_equal"], f"rank {rank}, {variant}: {outcome}"
            assert outcome["checks"] >= 2, f"rank {rank}, {variant}: too few checks after the restart: {outcome}"
            assert outcome["same_checks_as_uninterrupted"], f"rank {rank}, {variant}: the check history " \
                                                            f"differs from the uninterrupted run's: {outcome}"
        assert report["batch"]["pending_micro_batches"] > 0, f"the checkpoint fell between large batches: {report}"


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_killed_worker_ends_the_job_within_a_minute(controller, tmp_path):
    job = horovodrun(controller, "tests.workers.dies_mid_training", str(tmp_path), timeout=240)
    ended = time.time()
    killed_at = float((tmp_path / "killed_at").read_text())
    assert job.returncode != 0, job.stdout[-3000:]
    assert not (tmp_path / "finished").exists(), "rank 0 trained on alone after rank 1 died"
    assert ended - killed_at < 60, f"the job took {ended - killed_at:.0f} s to end after rank 1 died"


def second_local_address():
    """Horovod's elastic driver blacklists the host of a failed worker, and every worker on
    it: the survivor must be on another "host", so the two are this machine's loopback
    and its other IPv4 address."""
    import psutil
    import socket
    addresses = [a.address for nic in psutil.net_if_addrs().values() for a in nic
                 if a.family == socket.AF_INET and not a.address.startswith("127.")]
    return addresses[0] if addresses else None


@pytest.mark.multiworker
@pytest.mark.skipif(second_local_address() is None,
                    reason="the elastic test needs a second local IPv4 address besides loopback")
@pytest.mark.parametrize("framework", ["torch", "keras", "keras topk-sum"])
def test_elastic_a_killed_worker_and_a_rejoin_lose_no_committed_step(framework, tmp_path):
    """Rank 1 dies after the commit of step 12 (torch: inside the next step's backward, once the
    rate rode on its first buckets); the survivor trains alone from there with its own memory; a
    worker joins after the blacklist cooldown (Horovod elastic needs Gloo), and the two decide
    alike, through a decay of the rate."""
    (tmp_path / "hosts").write_text(f"127.0.0.1:1\n{second_local_address()}:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    discover.chmod(0o755)
    job = subprocess.run(
        [HOROVODRUN, "--gloo", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
         str(discover), "--blacklist-cooldown-range", "3", "6", sys.executable, "-m",
         f"tests.workers.{framework.split()[0]}_elastic_job", str(tmp_path), *framework.split()[1:]],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    workers = [[json.loads(line) for line in path.read_text().splitlines()]
               for path in sorted(tmp_path.glob("worker.*.jsonl"))]
    killed = [w for w in workers if not any(r["event"] == "done" for r in w)]
    survivors = [w for w in workers if any(r["event"] == "reset" and r["size"] == 1 for r in w)]
    assert len(workers) == 3 and len(killed) == 1 and len(survivors) == 1, workers
    assert [r for r in killed[0] if r["event"] == "commit"][-1]["accordion_step"] == 12, killed[0]

    survivor = survivors[0]
    alone = survivor.index(next(r for r in survivor if r["event"] == "reset" and r["size"] == 1))
    first_alone = survivor[alone + 1]
    commit_12 = next(r for r in survivor if r["event"] == "commit" and r["accordion_step"] == 12)
    # Nothing committed is lost, and the survivor keeps its own error-feedback memory.
    assert first_alone["accordion_step"] == 13 and first_alone["size"] == 1, first_alone
    assert first_alone["memory_norm_before"] == commit_12["memory_norm"] > 0, (first_alone, commit_12)
    assert sum(1 for r in survivor if r["event"] == "batch" and r["size"] == 1) >= 4, "the survivor never trained alone"

    joiner = next(w for w in workers if w is not survivor and w not in killed)
    joined = [r for r in joiner if r["event"] == "batch"]
    assert joined[0]["memory_norm_before"] == 0.0 and joined[0]["size"] == 2, joined[0]
    together = {r["accordion_step"]: r["levels"] for r in survivor
                if r["event"] == "batch" and r["accordion_step"] >= joined[0]["accordion_step"]}
    assert joined[0]["accordion_step"] in together, (joined[0], sorted(together))
    assert all(together[r["accordion_step"]] == r["levels"] for r in joined), "levels differ after the rejoin"
    if framework == "keras topk-sum":
        # TopK 90 % goes dense on 2 ranks and sparse alone: the traced step must see the world size change.
        sizes = {1: keras_topk_bytes(1), 2: keras_topk_bytes(2)}
        assert sizes[1] != sizes[2], sizes
        sent = {(r["size"], r["bytes_sent"]) for w in workers for r in w if r["event"] == "batch"}
        assert sent == {(1, sizes[1]), (2, sizes[2])}, (sent, sizes)
    done = [next(r for r in w if r["event"] == "done") for w in (survivor, joiner)]
    assert done[0]["weights"] == done[1]["weights"], done


def keras_topk_bytes(size, fraction=0.9, shapes=((16, 32), (32,), (32, 4), (4,))):
    """Bytes per step of static TopK on the Keras elastic job's model at ``size`` ranks: each
    matrix sparse (values and int16 indices) where that is cheaper, else dense; biases dense."""
    from horovod_accordion.core.compression import index_bytes, index_dtype, kept_count, packed_index_words, \
        sparse_is_cheaper
    total = 0
    for shape in shapes:
        numel = math.prod(shape)
        if len(shape) < 2:
            total += 4 * numel
            continue
        kept, dtype = kept_count(fraction, numel), index_dtype(numel)
        sparse = sparse_is_cheaper(kept, numel, index_bytes(dtype), size)
        total += 4 * (kept + packed_index_words(kept, dtype)) if sparse else 4 * numel
    return total
