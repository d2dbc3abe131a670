"""Jobs that stop: a resume in a new ``horovodrun`` job continues bit-identically, and a
killed worker ends the job instead of hanging the survivor."""
import json
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


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_resume_in_a_new_job_is_bitwise_identical_to_an_uninterrupted_run(framework, controller, tmp_path):
    module = {"torch": "tests.workers.resume_job", "keras": "tests.workers.tf_resume_job"}[framework]
    for phase in ("full", "resume"):
        job = horovodrun(controller, module, phase, str(tmp_path))
        assert job.returncode == 0, f"{phase}: " + job.stdout[-3000:] + job.stderr[-3000:]
    reports = [json.loads((tmp_path / f"resume.rank{rank}.json").read_text()) for rank in (0, 1)]
    rank_zero_resumes = [report.pop("rank0_only", None) for report in reports]
    if framework == "keras":  # and a resume where only rank 0 read its checkpoint
        assert rank_zero_resumes[0] == rank_zero_resumes[1], rank_zero_resumes
        assert rank_zero_resumes[0]["weights_identical_across_ranks"], rank_zero_resumes
        assert rank_zero_resumes[0]["steps"] == reports[0]["powersgd"]["steps"], rank_zero_resumes
    for rank, report in enumerate(reports):
        for variant, outcome in report.items():
            assert outcome["bitwise_equal"], f"rank {rank}, {variant}: {outcome}"
            assert outcome["checks"] >= 2, f"rank {rank}, {variant}: too few checks after the restart: {outcome}"
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
